"""Configuration shared by every service: settings from `BOOMERANG_*` variables and the common flags."""
