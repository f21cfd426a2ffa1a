"""ResNet-50 v1.5 in plain PyTorch (bottleneck blocks, [3, 4, 6, 3], 1000 classes), deterministic random weights.

Input: NCHW float32, 224 x 224 px, ImageNet mean/std normalisation. The stride-2 of each stage sits on
the 3 x 3 convolution (v1.5). Module names follow the usual layout (``conv1``, ``layer3.2.conv2``,
``layer2.0.downsample.0``, ``fc``) so traces read like any other ResNet-50's. The weights are random
(``weights: random`` in its manifest): use it for latency, throughput and profiling, never for accuracy.
"""
from __future__ import annotations

import torch
from torch import nn

LAYERS = {"resnet50": (3, 4, 6, 3)}
SEED = 0


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (stride) -> 1x1 expand (x4), plus the identity or a 1x1 projection."""
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """Stem (7x7/2 conv, 3x3/2 max-pool), four stages of bottlenecks, global average pool, linear classifier."""

    def __init__(self, layers: tuple[int, int, int, int] = (3, 4, 6, 3), num_classes: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._stage(64, layers[0], 1)
        self.layer2 = self._stage(128, layers[1], 2)
        self.layer3 = self._stage(256, layers[2], 2)
        self.layer4 = self._stage(512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)

    def _stage(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * Bottleneck.expansion, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * Bottleneck.expansion))
        stage = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        stage += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*stage)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def init_weights(model: nn.Module, seed: int = SEED) -> None:
    """Deterministic init from a local generator (the global RNG is untouched): He-normal convolutions,
    BN gamma 1 / beta 0 (the last BN of each residual branch gets gamma 0.2 so activations stay bounded
    through 16 blocks), classifier N(0, 0.01) with zero bias."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu", generator=g)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 0.2 if name.endswith("bn3") else 1.0)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.01, generator=g)
                nn.init.zeros_(m.bias)


def build_torch(name: str = "resnet50", weights_file: str | None = None) -> nn.Module:
    """ResNet-50 in eval mode: seeded random weights, or the state dict in ``weights_file`` when given."""
    if name not in LAYERS:
        raise ValueError(f"unknown ResNet {name!r}; expected one of {', '.join(LAYERS)}")
    model = ResNet(LAYERS[name])
    init_weights(model)
    if weights_file:
        model.load_state_dict(torch.load(str(weights_file), map_location="cpu", weights_only=True), strict=True)
    return model.eval()
