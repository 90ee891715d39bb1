"""Where and how a run happens: eval data and devices, torch.distributed helpers, the torchrun spread."""
