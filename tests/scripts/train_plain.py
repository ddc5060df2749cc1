"""A plain training script with no perfmagic in it, for `perfmagic run` tests."""

import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
data = TensorDataset(torch.randn(steps * 16, 32), torch.randn(steps * 16, 1))
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(data, batch_size=16):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    time.sleep(0.04)  # stands for work the hooks don't see: it must come out as "other", any load
print("trained", steps, "steps")
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
