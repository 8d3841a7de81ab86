"""Retention (layer L2): drops whole segments by length, bytes and age; never what a cursor
needs."""
