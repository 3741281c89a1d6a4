"""autotune: measure, don't guess, the fastest PyTorch training/inference settings for this machine."""
__version__ = "0.1.0"
