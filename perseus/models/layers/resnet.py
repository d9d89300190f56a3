"""Wide ResNet layers (torchvision's ResNet-50/101 layout with widened bottlenecks).

Width factor ``k`` multiplies the inner width of every bottleneck (``wide_resnet50_2`` is k=2).
Layers: the stem, one layer per bottleneck block, then pooling and the classifier.
"""

from __future__ import annotations

import torch
from torch import nn


class ResNetStem(nn.Module):
    """7x7 convolution, batch norm, ReLU and 3x3 max pooling."""

    def __init__(self, channels: int = 64) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``[batch, 3, H, W]`` images to ``[batch, 64, H/4, W/4]`` features."""
        return self.pool(nn.functional.relu(self.bn(self.conv(images))))


class Bottleneck(nn.Module):
    """1x1 -> 3x3 -> 1x1 residual bottleneck (stride on the 3x3, as torchvision)."""

    def __init__(self, in_channels: int, planes: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = planes * 4
        self.conv1 = nn.Conv2d(in_channels, width, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Residual update of ``x``."""
        y = nn.functional.relu(self.bn1(self.conv1(x)))
        y = nn.functional.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return nn.functional.relu(y + self.downsample(x))


class ResNetHead(nn.Module):
    """Global average pooling and the linear classifier."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits ``[batch, num_classes]``."""
        return self.fc(x.mean(dim=(2, 3)))
