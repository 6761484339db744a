"""``python -m worker``."""

from .cli import main

main()
