"""Process groups, device meshes and the data-parallel backends behind ``ddp_wrap``.

This package imports torch.distributed; the config layer never imports it.
"""
