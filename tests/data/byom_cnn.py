"""A small real CNN of the tests' own (not in the zoo), importable as ``tests.data.byom_cnn`` so that a manifest's
``model.entrypoint: "tests.data.byom_cnn:SmallCNN"`` builds it; :func:`seeded` gives it non-trivial weights."""
from __future__ import annotations

import torch


class SmallCNN(torch.nn.Module):
    """conv-bn-relu-pool twice, a shared ReLU called twice, a residual add, global pooling, a linear head."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16),
                                         torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, padding=1))
        self.conv = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.bn = torch.nn.BatchNorm2d(16)
        self.act = torch.nn.ReLU6()
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.head = torch.nn.Linear(16, classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.act(self.bn(self.conv(x))) + x
        x = self.act(x)
        return self.head(torch.flatten(self.pool(x), 1))


def seeded(classes: int = 10, seed: int = 0) -> SmallCNN:
    """An eval-mode SmallCNN with seeded weights, non-trivial BatchNorm statistics (so folding them is really tested)
    and a head scaled so that the top-1 class differs between inputs."""
    torch.manual_seed(seed)
    model = SmallCNN(classes)
    with torch.no_grad():
        for bn in (model.stem[1], model.bn):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
        model.head.weight.mul_(20.0)
    return model.eval()
