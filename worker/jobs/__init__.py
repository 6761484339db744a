"""Job families: what each queue the daemon installs does. One module per family."""
