"""`--help` that shows each flag's default, except where there is none to show (required flags, None, [])."""

from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        if action.required or action.default in (None, [], argparse.SUPPRESS):
            return action.help or ""
        return super()._get_help_string(action)
