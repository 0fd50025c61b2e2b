"""The ardea command line."""
