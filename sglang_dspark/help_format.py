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
