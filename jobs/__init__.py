"""Entry points for `ray job submit` and the `edje` command's subcommands, installed as `edje.jobs`
(ARCHITECTURE.md lists each module)."""
