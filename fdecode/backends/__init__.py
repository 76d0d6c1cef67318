"""Machine-specific backend tuning, one folder per device kind (`cpu/`): the code that reaches into a
compiler's internals lives here and nowhere else, so a torch upgrade that breaks it breaks one folder."""
