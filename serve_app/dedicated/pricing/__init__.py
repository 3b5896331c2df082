"""Pricing and metering: the rate card's arithmetic and the billed replica lifetimes."""
