"""Task data for verl: ``python -m verl_gigpo.data.prepare``."""
