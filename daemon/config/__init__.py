"""Configuration as data: the directive table, its value kinds, CONFIG GET/SET/REWRITE and the config file."""
