"""A user's project as the README's "Run your own project" shows it: a package, a config file, requirements."""
