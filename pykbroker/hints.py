"""The pointer every refusal of a setting ends with: where the README lists what is not implemented."""

NOT_IMPLEMENTED_HINT = "see README 'Settings not implemented'"
