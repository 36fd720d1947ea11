"""One module per noun of the admin CLI (topic, group, config, ...); each exports ``COMMANDS``."""
