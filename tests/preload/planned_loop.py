"""planned_loop.py - a small denoiser-shaped loop (convs, attention, a carried latent) on the
CPU. Run with the drop-in in mode:planned and no step marks, its steps must be found, planned
and served from the arena (the report says so), and its result must be glibc's to the bit.
"""
import torch
torch.manual_seed(0); torch.set_num_threads(1)
c1=torch.nn.Conv2d(320,320,3,padding=1); c2=torch.nn.Conv2d(320,320,3,padding=1); lin=torch.nn.Linear(320,320)
x=torch.randn(1,320,32,32)
with torch.no_grad():
  for step in range(30):
    h=c1(x).relu(); h=c2(h)+x; t=h.flatten(2).transpose(1,2); a=(t@t.transpose(1,2)).softmax(-1)@t; x=(lin(a).transpose(1,2).reshape(1,320,32,32)*0.1+x*0.9)
print("done", x.abs().mean().item())
