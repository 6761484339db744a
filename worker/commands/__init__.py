"""The CLI's subcommands, one module per family."""
