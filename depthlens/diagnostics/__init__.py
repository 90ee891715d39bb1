"""The diagnostic registry, the engines, and the threshold sweeps over the registry's scores."""
