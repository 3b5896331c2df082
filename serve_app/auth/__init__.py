"""API keys, accounts and the checks of spec section 5. No Ray imports here."""
