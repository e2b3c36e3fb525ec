"""Embedded data: real public config.json files (models/*.json). Code that reads them is in kvops.model.catalog."""
