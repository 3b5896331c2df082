"""The responses route: input items, optional fields, the Response and its named stream events."""
