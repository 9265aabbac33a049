"""Train a small convolutional classifier with Lightning: a LightningDataModule with its own loaders, a
OneCycle LR schedule stepped every batch, gradient clipping by norm. The images are generated (noisy
stripes whose orientation is the label), augmented on the host with a random flip and crop.

    python lightning_clip.py --max_steps 300 --batch_size 32 --num_workers 0
"""

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Stripes(Dataset):
    def __init__(self, size: int, image: int, seed: int):
        self.size, self.image, self.seed = size, image, seed

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 100_003 + i)
        label = int(torch.randint(0, 4, (), generator=g))
        x = torch.arange(self.image + 8, dtype=torch.float32)
        grid = x[:, None] * (label % 2) + x[None, :] * (1 - label % 2) + (label // 2) * x[:, None] * x[None, :] / 40
        img = torch.sin(grid / 3).expand(3, -1, -1) + 0.5 * torch.randn(3, self.image + 8, self.image + 8, generator=g)
        top, left = torch.randint(0, 9, (2,), generator=g).tolist()
        img = img[:, top : top + self.image, left : left + self.image]
        if torch.rand((), generator=g) < 0.5:
            img = img.flip(-1)
        return img, label


class StripesData(L.LightningDataModule):
    def __init__(self, batch_size: int = 32, num_workers: int = 0, image: int = 32, size: int = 8192):
        super().__init__()
        self.batch_size, self.num_workers, self.image, self.size = batch_size, num_workers, image, size

    def setup(self, stage=None):
        self.train = Stripes(self.size, self.image, seed=0)
        self.val = Stripes(self.size // 8, self.image, seed=1)

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size, num_workers=self.num_workers)


class ConvNet(L.LightningModule):
    def __init__(self, width: int = 32, lr: float = 3e-3, max_steps: int = 300):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(2 * width, 4),
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(-1) == y).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.05)
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=self.hparams.lr, total_steps=self.hparams.max_steps
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max_steps", type=int, default=300)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_workers", type=int, default=0)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--precision", default="32-true")
    args = parser.parse_args()

    L.seed_everything(0)
    data = StripesData(args.batch_size, args.num_workers, args.image)
    model = ConvNet(args.width, max_steps=args.max_steps)
    trainer = L.Trainer(
        max_steps=args.max_steps,
        precision=args.precision,
        gradient_clip_val=1.0,
        val_check_interval=100,
        check_val_every_n_epoch=None,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(model, datamodule=data)


if __name__ == "__main__":
    main()
