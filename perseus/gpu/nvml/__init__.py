"""The real device: NVIDIA GPUs driven through NVML, and which NVML device a CUDA index is."""
