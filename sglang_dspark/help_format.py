"""`--help` that shows each flag's default, except where there is none to show (required flags, None,
[], and an off switch)."""

from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        off_switch = action.nargs == 0 and action.default is False
        if action.required or off_switch or action.default in (None, [], argparse.SUPPRESS):
            return action.help or ""
        return super()._get_help_string(action)


EXIT_BAD_INPUT = 2


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse's usage errors as one line on stderr, `error: <reason> (see --help)`, exit status 2,
    without the usage block: like every other failure of the bundle's commands. Sub-commands made by
    `add_subparsers` are of the parent's class, so they inherit it."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"error: {' '.join(message.split())} (see --help)\n")
