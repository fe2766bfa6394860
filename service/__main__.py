"""`python -m service`: serve predictions over HTTP (service/cli.py; `perfmodel serve` runs this)."""

from service.cli import main

main()
