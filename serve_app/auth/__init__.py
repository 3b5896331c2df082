"""API keys, accounts and the checks of docs/reference/common.md#authentication. No Ray imports
here."""
