"""The ``affinity`` console command. Subcommands live in their own modules."""

__all__: list[str] = []
