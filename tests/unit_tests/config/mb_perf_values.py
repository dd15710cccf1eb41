"""Megatron-Bridge's flat pretraining perf recipes for the Llama 3 and Qwen3 families at commit ``MB_COMMIT`` of
NVIDIA-NeMo/Megatron-Bridge (``src/megatron/bridge/perf_recipes/{llama,qwen}/<gpu>/*.py``): what each
``<model>_pretrain_<N>gpu_<gpu>_<dtype>_config`` function returns, read by running the functions with their base
recipes stubbed. Kept apart from the shipped rows (``megatron_bridge.recipes.perf_tables``) so that a test compares
what ``launch.py`` builds with these values."""

MB_COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
FIELDS = ("tp", "pp", "cp", "vp", "ep", "sp", "global_batch_size", "micro_batch_size", "seq_length", "recompute",
          "cpu_offloading_num_layers", "use_megatron_fsdp", "env_digest")
"""``recompute``: (granularity, method, layers) or None; ``env_digest``: the first 12 hex digits of the SHA-256 of
its ``env_vars`` as sorted JSON with string values."""
MB_PERF_VALUES: dict[str, tuple] = {
    "llama31_405b_pretrain_1024gpu_h100_bf16_config": (
        8, 8, 2, 8, 1, True, 1536, 1, 8192, None, None, False, '3a84c10f0a4d'),
    "llama31_405b_pretrain_1024gpu_h100_fp8cs_config": (
        8, 8, 2, 8, 1, True, 1536, 1, 8192, None, None, False, '3a84c10f0a4d'),
    "llama31_405b_pretrain_128gpu_b200_bf16_config": (
        4, 16, 1, 8, 1, True, 768, 1, 8192, None, None, False, '3f49659599a4'),
    "llama31_405b_pretrain_128gpu_b200_fp8cs_config": (
        4, 16, 1, 4, 1, True, 768, 1, 8192, None, None, False, '3f49659599a4'),
    "llama31_405b_pretrain_128gpu_b200_fp8mx_config": (
        4, 16, 1, 8, 1, True, 768, 1, 8192, None, None, False, '3f49659599a4'),
    "llama31_405b_pretrain_128gpu_b200_nvfp4_config": (
        4, 16, 1, 8, 1, True, 768, 1, 8192, None, None, False, 'c75ce3916348'),
    "llama31_405b_pretrain_128gpu_b300_bf16_config": (
        2, 1, 1, None, 1, True, 768, 1, 8192, None, 40, True, 'e2b2ad7900a6'),
    "llama31_405b_pretrain_128gpu_b300_fp8cs_config": (
        4, 8, 1, 4, 1, True, 768, 1, 8192, None, None, False, '476c04e4cda0'),
    "llama31_405b_pretrain_128gpu_b300_fp8mx_config": (
        2, 8, 2, 4, 1, True, 768, 1, 8192, None, None, False, '476c04e4cda0'),
    "llama31_405b_pretrain_128gpu_b300_nvfp4_config": (
        4, 8, 1, 4, 1, True, 768, 1, 8192, None, None, False, '69c0b2914ac0'),
    "llama31_405b_pretrain_128gpu_gb200_bf16_config": (
        4, 16, 1, 8, 1, True, 768, 1, 8192, None, None, False, '3f49659599a4'),
    "llama31_405b_pretrain_128gpu_gb200_fp8cs_config": (
        4, 16, 1, 4, 1, True, 768, 1, 8192, None, None, False, '498b161644d0'),
    "llama31_405b_pretrain_128gpu_gb200_fp8mx_config": (
        4, 16, 1, 8, 1, True, 768, 1, 8192, None, None, False, '3f49659599a4'),
    "llama31_405b_pretrain_128gpu_gb200_nvfp4_config": (
        4, 16, 1, 8, 1, True, 768, 1, 8192, None, None, False, 'c75ce3916348'),
    "llama31_405b_pretrain_128gpu_gb300_bf16_config": (
        2, 1, 1, None, 1, True, 768, 1, 8192, None, 40, True, 'f2578f6b074f'),
    "llama31_405b_pretrain_128gpu_gb300_fp8cs_config": (
        4, 8, 1, 4, 1, True, 768, 1, 8192, None, None, False, '498b161644d0'),
    "llama31_405b_pretrain_128gpu_gb300_fp8mx_config": (
        2, 8, 2, 4, 1, True, 768, 1, 8192, None, None, False, '3f49659599a4'),
    "llama31_405b_pretrain_128gpu_gb300_nvfp4_config": (
        4, 8, 1, 4, 1, True, 768, 1, 8192, None, None, False, 'c75ce3916348'),
    "llama31_405b_pretrain_256gpu_b200_nvfp4_config": (
        4, 16, 1, 8, 1, True, 1536, 1, 8192, None, None, False, 'c75ce3916348'),
    "llama31_405b_pretrain_256gpu_b300_bf16_config": (
        2, 1, 1, None, 1, True, 1536, 1, 8192, None, 40, True, 'e2b2ad7900a6'),
    "llama31_405b_pretrain_256gpu_gb200_bf16_config": (
        4, 16, 1, 8, 1, True, 1536, 1, 8192, None, None, False, '3f49659599a4'),
    "llama31_405b_pretrain_256gpu_gb200_fp8cs_config": (
        4, 16, 1, 4, 1, True, 1536, 1, 8192, None, None, False, '498b161644d0'),
    "llama31_405b_pretrain_256gpu_gb200_fp8mx_config": (
        4, 16, 1, 8, 1, True, 1536, 1, 8192, None, None, False, '3f49659599a4'),
    "llama31_405b_pretrain_256gpu_gb200_nvfp4_config": (
        4, 16, 1, 8, 1, True, 1536, 1, 8192, None, None, False, 'c75ce3916348'),
    "llama31_405b_pretrain_256gpu_gb300_bf16_config": (
        2, 1, 1, None, 1, True, 1536, 1, 8192, None, 40, True, 'f2578f6b074f'),
    "llama31_405b_pretrain_256gpu_gb300_fp8cs_config": (
        4, 8, 1, 4, 1, True, 1536, 1, 8192, None, None, False, '498b161644d0'),
    "llama31_405b_pretrain_256gpu_gb300_fp8mx_config": (
        2, 8, 2, 4, 1, True, 1536, 1, 8192, None, None, False, '3f49659599a4'),
    "llama31_405b_pretrain_256gpu_gb300_nvfp4_config": (
        4, 8, 1, 4, 1, True, 1536, 1, 8192, None, None, False, 'c75ce3916348'),
    "llama31_405b_pretrain_256gpu_vr200_bf16_config": (
        2, 1, 1, None, 1, True, 1536, 1, 8192, None, 40, True, 'f2578f6b074f'),
    "llama31_405b_pretrain_256gpu_vr200_fp8mx_config": (
        2, 8, 2, 4, 1, True, 1536, 1, 8192, None, None, False, '3f49659599a4'),
    "llama31_405b_pretrain_256gpu_vr200_nvfp4_config": (
        4, 8, 1, 4, 1, True, 1536, 1, 8192, None, None, False, 'c75ce3916348'),
    "llama31_405b_pretrain_512gpu_h100_bf16_config": (
        8, 8, 2, 8, 1, True, 768, 1, 8192, None, None, False, '3a84c10f0a4d'),
    "llama31_405b_pretrain_512gpu_h100_fp8cs_config": (
        8, 8, 2, 8, 1, True, 768, 1, 8192, None, None, False, '3a84c10f0a4d'),
    "llama3_70b_pretrain_32gpu_gb200_bf16_config": (
        1, 1, 1, None, 1, False, 128, 1, 8192, None, 20, True, 'dc5c2b07a632'),
    "llama3_70b_pretrain_32gpu_gb200_fp8cs_config": (
        1, 1, 1, None, 1, False, 128, 2, 8192, None, 40, True, 'dc5c2b07a632'),
    "llama3_70b_pretrain_32gpu_gb300_bf16_config": (
        1, 1, 1, None, 1, False, 128, 2, 8192, None, 30, True, '1edfb1fb516e'),
    "llama3_70b_pretrain_32gpu_gb300_fp8cs_config": (
        1, 1, 1, None, 1, False, 128, 2, 8192, None, 20, True, 'dc5c2b07a632'),
    "llama3_70b_pretrain_64gpu_b200_bf16_config": (
        2, 4, 2, 5, 1, True, 256, 1, 8192, None, None, False, 'c8c5eeaa2db3'),
    "llama3_70b_pretrain_64gpu_b200_fp8cs_config": (
        1, 1, 1, None, 1, False, 256, 1, 8192, None, 5, True, 'f2578f6b074f'),
    "llama3_70b_pretrain_64gpu_b200_fp8mx_config": (
        2, 4, 1, 5, 1, True, 256, 1, 8192, None, None, False, '3f49659599a4'),
    "llama3_70b_pretrain_64gpu_b200_nvfp4_config": (
        2, 4, 1, 5, 1, True, 256, 1, 8192, None, None, False, 'c75ce3916348'),
    "llama3_70b_pretrain_64gpu_b300_bf16_config": (
        1, 1, 1, None, 1, False, 256, 1, 8192, None, None, True, 'e2b2ad7900a6'),
    "llama3_70b_pretrain_64gpu_b300_fp8cs_config": (
        1, 1, 1, None, 1, False, 256, 1, 8192, None, None, True, 'e2b2ad7900a6'),
    "llama3_70b_pretrain_64gpu_b300_fp8mx_config": (
        1, 4, 1, 5, 1, False, 256, 1, 8192, None, None, False, '476c04e4cda0'),
    "llama3_70b_pretrain_64gpu_b300_nvfp4_config": (
        1, 4, 1, 5, 1, False, 256, 1, 8192, None, None, False, '69c0b2914ac0'),
    "llama3_70b_pretrain_64gpu_gb200_bf16_config": (
        1, 1, 1, None, 1, False, 256, 1, 8192, None, 20, True, 'dc5c2b07a632'),
    "llama3_70b_pretrain_64gpu_gb200_fp8cs_config": (
        1, 1, 1, None, 1, False, 256, 2, 8192, None, 40, True, 'dc5c2b07a632'),
    "llama3_70b_pretrain_64gpu_gb200_fp8mx_config": (
        2, 4, 1, 5, 1, True, 256, 1, 8192, None, None, False, '3f49659599a4'),
    "llama3_70b_pretrain_64gpu_gb200_nvfp4_config": (
        2, 4, 1, 5, 1, True, 256, 1, 8192, None, None, False, 'c75ce3916348'),
    "llama3_70b_pretrain_64gpu_gb300_bf16_config": (
        1, 1, 1, None, 1, False, 256, 2, 8192, None, 30, True, '1edfb1fb516e'),
    "llama3_70b_pretrain_64gpu_gb300_fp8cs_config": (
        1, 1, 1, None, 1, False, 256, 2, 8192, None, 20, True, 'dc5c2b07a632'),
    "llama3_70b_pretrain_64gpu_gb300_fp8mx_config": (
        1, 4, 1, 5, 1, False, 256, 1, 8192, None, None, False, '3f49659599a4'),
    "llama3_70b_pretrain_64gpu_gb300_nvfp4_config": (
        1, 4, 1, 5, 1, False, 256, 1, 8192, None, None, False, 'c75ce3916348'),
    "llama3_70b_pretrain_64gpu_h100_bf16_config": (
        4, 4, 2, 5, 1, True, 256, 1, 8192, None, None, False, '3a84c10f0a4d'),
    "llama3_70b_pretrain_64gpu_h100_fp8cs_config": (
        4, 8, 1, 5, 1, True, 256, 1, 8192, None, None, False, '3a84c10f0a4d'),
    "llama3_70b_pretrain_64gpu_vr200_bf16_config": (
        1, 1, 1, None, 1, False, 256, 2, 8192, None, 30, True, '1edfb1fb516e'),
    "llama3_70b_pretrain_64gpu_vr200_fp8mx_config": (
        1, 4, 1, 5, 1, False, 256, 1, 8192, None, None, False, '3f49659599a4'),
    "llama3_70b_pretrain_64gpu_vr200_nvfp4_config": (
        1, 4, 1, 5, 1, False, 256, 1, 8192, None, None, False, 'c75ce3916348'),
    "llama3_8b_pretrain_32gpu_gb200_bf16_config": (
        1, 1, 1, None, 1, False, 512, 2, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_32gpu_gb200_fp8cs_config": (
        1, 1, 1, None, 1, False, 512, 2, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_32gpu_gb300_bf16_config": (
        1, 1, 1, None, 1, False, 512, 4, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_32gpu_gb300_fp8cs_config": (
        1, 1, 1, None, 1, False, 512, 4, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_32gpu_gb300_fp8mx_config": (
        1, 1, 1, None, 1, False, 512, 4, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_32gpu_gb300_nvfp4_config": (
        1, 1, 1, None, 1, False, 512, 4, 8192, None, None, False, 'f6c026f2bb29'),
    "llama3_8b_pretrain_64gpu_b200_bf16_config": (
        1, 1, 1, None, 1, False, 1024, 2, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_64gpu_b200_fp8cs_config": (
        1, 1, 1, None, 1, False, 1024, 2, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_64gpu_h100_bf16_config": (
        1, 1, 2, None, 1, False, 1024, 1, 8192, None, None, False, 'cd43528f8da8'),
    "llama3_8b_pretrain_64gpu_h100_fp8cs_config": (
        1, 1, 1, None, 1, False, 1024, 1, 8192, ('full', 'block', 5), None, False, 'db9380da5a74'),
    "llama3_8b_pretrain_8gpu_b200_bf16_config": (
        1, 1, 1, None, 1, False, 128, 2, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_8gpu_b200_fp8cs_config": (
        1, 1, 1, None, 1, False, 128, 2, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_8gpu_b200_fp8mx_config": (
        1, 1, 1, None, 1, False, 128, 2, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_8gpu_b200_nvfp4_config": (
        1, 1, 1, None, 1, False, 128, 4, 8192, None, None, False, 'a2717658bda4'),
    "llama3_8b_pretrain_8gpu_b300_bf16_config": (
        1, 1, 1, None, 1, False, 128, 4, 8192, None, None, False, '898365d8a155'),
    "llama3_8b_pretrain_8gpu_b300_fp8cs_config": (
        1, 1, 1, None, 1, False, 128, 4, 8192, None, None, False, '898365d8a155'),
    "llama3_8b_pretrain_8gpu_b300_fp8mx_config": (
        1, 1, 1, None, 1, False, 128, 4, 8192, None, None, False, '898365d8a155'),
    "llama3_8b_pretrain_8gpu_b300_nvfp4_config": (
        1, 1, 1, None, 1, False, 128, 4, 8192, None, None, False, 'e6e70758ba08'),
    "llama3_8b_pretrain_8gpu_gb200_bf16_config": (
        1, 1, 1, None, 1, False, 128, 2, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_8gpu_gb200_fp8cs_config": (
        1, 1, 1, None, 1, False, 128, 2, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_8gpu_gb200_fp8mx_config": (
        1, 1, 1, None, 1, False, 128, 2, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_8gpu_gb200_nvfp4_config": (
        1, 1, 1, None, 1, False, 128, 4, 8192, None, None, False, '133f65886fdf'),
    "llama3_8b_pretrain_8gpu_gb300_bf16_config": (
        1, 1, 1, None, 1, False, 128, 4, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_8gpu_gb300_fp8cs_config": (
        1, 1, 1, None, 1, False, 128, 4, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_8gpu_gb300_fp8mx_config": (
        1, 1, 1, None, 1, False, 128, 4, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_8gpu_gb300_nvfp4_config": (
        1, 1, 1, None, 1, False, 128, 4, 8192, None, None, False, 'f6c026f2bb29'),
    "llama3_8b_pretrain_8gpu_h100_bf16_config": (
        1, 1, 2, None, 1, False, 128, 1, 8192, None, None, False, 'cd43528f8da8'),
    "llama3_8b_pretrain_8gpu_h100_fp8cs_config": (
        1, 1, 1, None, 1, False, 128, 1, 8192, ('full', 'block', 5), None, False, 'db9380da5a74'),
    "llama3_8b_pretrain_8gpu_r100_bf16_config": (
        1, 1, 1, None, 1, False, 128, 1, 8192, None, None, False, 'd8ef28952005'),
    "llama3_8b_pretrain_8gpu_r100_fp8cs_config": (
        1, 1, 1, None, 1, False, 128, 1, 8192, None, None, False, 'd8ef28952005'),
    "llama3_8b_pretrain_8gpu_r100_fp8mx_config": (
        1, 1, 1, None, 1, False, 128, 1, 8192, None, None, False, 'd8ef28952005'),
    "llama3_8b_pretrain_8gpu_r100_nvfp4_config": (
        1, 1, 1, None, 1, False, 128, 1, 8192, None, None, False, 'a2717658bda4'),
    "llama3_8b_pretrain_8gpu_vr200_bf16_config": (
        1, 1, 1, None, 1, False, 128, 4, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_8gpu_vr200_fp8cs_config": (
        1, 1, 1, None, 1, False, 128, 4, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_8gpu_vr200_fp8mx_config": (
        1, 1, 1, None, 1, False, 128, 4, 8192, None, None, False, 'fd93c9236945'),
    "llama3_8b_pretrain_8gpu_vr200_nvfp4_config": (
        1, 1, 1, None, 1, False, 128, 4, 8192, None, None, False, 'f6c026f2bb29'),
    "qwen3_235b_a22b_pretrain_256gpu_b200_bf16_config": (
        1, 8, 1, 4, 8, False, 8192, 1, 4096, None, None, False, '1aff4e5a9907'),
    "qwen3_235b_a22b_pretrain_256gpu_b200_fp8cs_config": (
        1, 8, 1, None, 8, False, 8192, 1, 4096, None, None, False, '1aff4e5a9907'),
    "qwen3_235b_a22b_pretrain_256gpu_b200_fp8mx_config": (
        1, 8, 1, 3, 8, False, 8192, 1, 4096, None, None, False, '28233a936636'),
    "qwen3_235b_a22b_pretrain_256gpu_b200_nvfp4_config": (
        1, 8, 1, None, 8, False, 8192, 1, 4096, None, None, False, 'ce318dec6502'),
    "qwen3_235b_a22b_pretrain_256gpu_b300_bf16_config": (
        1, 8, 1, None, 8, False, 8192, 2, 4096, None, None, False, 'ee83f1bfdb4d'),
    "qwen3_235b_a22b_pretrain_256gpu_b300_fp8cs_config": (
        1, 8, 1, None, 8, False, 8192, 2, 4096, None, None, False, 'ee83f1bfdb4d'),
    "qwen3_235b_a22b_pretrain_256gpu_b300_fp8mx_config": (
        1, 8, 1, 3, 8, False, 8192, 2, 4096, None, None, False, '8fc7570b9d6f'),
    "qwen3_235b_a22b_pretrain_256gpu_b300_nvfp4_config": (
        1, 8, 1, None, 8, False, 8192, 2, 4096, None, None, False, '3419d51df1c2'),
    "qwen3_235b_a22b_pretrain_256gpu_gb200_bf16_config": (
        1, 8, 1, None, 8, False, 8192, 1, 4096, None, None, False, 'f929320788f7'),
    "qwen3_235b_a22b_pretrain_256gpu_gb200_fp8cs_config": (
        1, 8, 1, None, 32, False, 8192, 1, 4096, None, None, False, 'e246a0eb7905'),
    "qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx_config": (
        1, 8, 1, 3, 32, False, 8192, 1, 4096, None, None, False, 'e5dd7b030ba9'),
    "qwen3_235b_a22b_pretrain_256gpu_gb200_nvfp4_config": (
        1, 8, 1, None, 32, False, 8192, 1, 4096, None, None, False, '2197bc0f0001'),
    "qwen3_235b_a22b_pretrain_256gpu_gb300_bf16_config": (
        1, 4, 1, None, 32, False, 8192, 2, 4096, None, None, False, 'e246a0eb7905'),
    "qwen3_235b_a22b_pretrain_256gpu_gb300_fp8cs_config": (
        1, 4, 1, None, 32, False, 8192, 2, 4096, None, None, False, 'e246a0eb7905'),
    "qwen3_235b_a22b_pretrain_256gpu_gb300_fp8mx_config": (
        1, 4, 1, 12, 32, False, 8192, 2, 4096, None, None, False, 'e5dd7b030ba9'),
    "qwen3_235b_a22b_pretrain_256gpu_gb300_nvfp4_config": (
        1, 4, 1, None, 32, False, 8192, 2, 4096, None, None, False, '2197bc0f0001'),
    "qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config": (
        2, 8, 1, 4, 32, True, 8192, 1, 4096, None, None, False, '742dfe0c20a0'),
    "qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs_config": (
        2, 8, 1, 4, 32, True, 8192, 1, 4096, None, None, False, '742dfe0c20a0'),
    "qwen3_235b_a22b_pretrain_256gpu_vr200_bf16_config": (
        1, 4, 1, None, 32, False, 8192, 2, 4096, None, None, False, 'e246a0eb7905'),
    "qwen3_235b_a22b_pretrain_256gpu_vr200_fp8mx_config": (
        1, 4, 1, 12, 32, False, 8192, 2, 4096, None, None, False, 'e5dd7b030ba9'),
    "qwen3_235b_a22b_pretrain_256gpu_vr200_nvfp4_config": (
        1, 4, 1, None, 32, False, 8192, 2, 4096, None, None, False, '2197bc0f0001'),
    "qwen3_235b_a22b_pretrain_64gpu_b200_bf16_config": (
        1, 8, 1, 4, 8, False, 2048, 1, 4096, None, None, False, '1aff4e5a9907'),
    "qwen3_235b_a22b_pretrain_64gpu_b200_fp8cs_config": (
        1, 8, 1, None, 8, False, 2048, 1, 4096, None, None, False, '1aff4e5a9907'),
    "qwen3_235b_a22b_pretrain_64gpu_b200_fp8mx_config": (
        1, 8, 1, None, 8, False, 2048, 1, 4096, None, None, False, '1aff4e5a9907'),
    "qwen3_235b_a22b_pretrain_64gpu_b200_nvfp4_config": (
        1, 8, 1, None, 8, False, 2048, 1, 4096, None, None, False, 'ce318dec6502'),
    "qwen3_235b_a22b_pretrain_64gpu_b300_bf16_config": (
        1, 8, 1, None, 8, False, 2048, 2, 4096, None, None, False, 'ee83f1bfdb4d'),
    "qwen3_235b_a22b_pretrain_64gpu_b300_fp8cs_config": (
        1, 8, 1, None, 8, False, 2048, 2, 4096, None, None, False, 'ee83f1bfdb4d'),
    "qwen3_235b_a22b_pretrain_64gpu_b300_fp8mx_config": (
        1, 8, 1, None, 8, False, 2048, 2, 4096, None, None, False, 'ee83f1bfdb4d'),
    "qwen3_235b_a22b_pretrain_64gpu_b300_nvfp4_config": (
        1, 8, 1, None, 8, False, 2048, 2, 4096, None, None, False, '3419d51df1c2'),
    "qwen3_235b_a22b_pretrain_64gpu_gb200_bf16_config": (
        1, 8, 1, None, 8, False, 2048, 1, 4096, None, None, False, 'f929320788f7'),
    "qwen3_235b_a22b_pretrain_64gpu_gb200_fp8cs_config": (
        1, 8, 1, None, 32, False, 2048, 1, 4096, None, None, False, 'e246a0eb7905'),
    "qwen3_235b_a22b_pretrain_64gpu_gb200_fp8mx_config": (
        1, 8, 1, 3, 32, False, 2048, 1, 4096, None, None, False, 'e5dd7b030ba9'),
    "qwen3_235b_a22b_pretrain_64gpu_gb200_nvfp4_config": (
        1, 8, 1, None, 32, False, 2048, 1, 4096, None, None, False, '2197bc0f0001'),
    "qwen3_235b_a22b_pretrain_64gpu_gb300_bf16_config": (
        1, 4, 1, None, 32, False, 2048, 2, 4096, None, None, False, 'e246a0eb7905'),
    "qwen3_235b_a22b_pretrain_64gpu_gb300_fp8cs_config": (
        1, 4, 1, None, 32, False, 2048, 2, 4096, None, None, False, 'e246a0eb7905'),
    "qwen3_235b_a22b_pretrain_64gpu_gb300_fp8mx_config": (
        1, 4, 1, 12, 32, False, 2048, 2, 4096, None, None, False, 'e5dd7b030ba9'),
    "qwen3_235b_a22b_pretrain_64gpu_gb300_nvfp4_config": (
        1, 4, 1, None, 32, False, 2048, 2, 4096, None, None, False, '2197bc0f0001'),
    "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config": (
        1, 1, 1, None, 16, False, 1024, 1, 4096, None, None, False, '2db9bff25728'),
    "qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config": (
        1, 1, 1, None, 16, False, 1024, 1, 4096, None, None, False, '05cd842a60b7'),
    "qwen3_30b_a3b_pretrain_32gpu_gb200_bf16_config": (
        1, 1, 1, None, 8, False, 2048, 4, 4096, None, None, False, 'f929320788f7'),
    "qwen3_30b_a3b_pretrain_32gpu_gb200_fp8cs_config": (
        1, 1, 1, None, 8, False, 2048, 4, 4096, None, None, False, 'f929320788f7'),
    "qwen3_30b_a3b_pretrain_32gpu_gb300_bf16_config": (
        1, 1, 1, None, 8, False, 2048, 8, 4096, None, None, False, 'f929320788f7'),
    "qwen3_30b_a3b_pretrain_32gpu_gb300_fp8cs_config": (
        1, 1, 1, None, 8, False, 2048, 8, 4096, None, None, False, 'f929320788f7'),
    "qwen3_30b_a3b_pretrain_64gpu_b200_bf16_config": (
        1, 1, 1, None, 8, False, 4096, 4, 4096, None, None, False, '4acef4138e0b'),
    "qwen3_30b_a3b_pretrain_64gpu_b200_fp8cs_config": (
        1, 1, 1, None, 8, False, 4096, 4, 4096, None, None, False, '4acef4138e0b'),
    "qwen3_30b_a3b_pretrain_64gpu_h100_bf16_config": (
        1, 1, 1, None, 16, False, 4096, 1, 4096, None, None, False, '4acef4138e0b'),
    "qwen3_30b_a3b_pretrain_64gpu_h100_fp8cs_config": (
        1, 1, 1, None, 16, False, 4096, 1, 4096, None, None, False, '4acef4138e0b'),
    "qwen3_30b_a3b_pretrain_8gpu_b200_bf16_config": (
        1, 1, 1, None, 8, False, 512, 4, 4096, None, None, False, '4acef4138e0b'),
    "qwen3_30b_a3b_pretrain_8gpu_b200_fp8cs_config": (
        1, 1, 1, None, 8, False, 512, 4, 4096, None, None, False, '4acef4138e0b'),
    "qwen3_30b_a3b_pretrain_8gpu_b200_fp8mx_config": (
        1, 1, 1, None, 8, False, 512, 4, 4096, None, None, False, '05cd842a60b7'),
    "qwen3_30b_a3b_pretrain_8gpu_b200_nvfp4_config": (
        1, 1, 1, None, 8, False, 512, 4, 4096, None, None, False, '8767850b60de'),
    "qwen3_30b_a3b_pretrain_8gpu_b300_bf16_config": (
        1, 1, 1, None, 8, False, 512, 8, 4096, None, None, False, 'ee83f1bfdb4d'),
    "qwen3_30b_a3b_pretrain_8gpu_b300_fp8cs_config": (
        1, 1, 1, None, 8, False, 512, 8, 4096, None, None, False, 'ee83f1bfdb4d'),
    "qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config": (
        1, 1, 1, None, 8, False, 512, 8, 4096, None, None, False, '8fc7570b9d6f'),
    "qwen3_30b_a3b_pretrain_8gpu_b300_nvfp4_config": (
        1, 1, 1, None, 8, False, 512, 8, 4096, None, None, False, '3419d51df1c2'),
    "qwen3_30b_a3b_pretrain_8gpu_gb200_bf16_config": (
        1, 1, 1, None, 8, False, 512, 4, 4096, None, None, False, 'f929320788f7'),
    "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8cs_config": (
        1, 1, 1, None, 8, False, 512, 4, 4096, None, None, False, 'f929320788f7'),
    "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config": (
        1, 1, 1, None, 8, False, 512, 4, 4096, None, None, False, '65e2e389d0f3'),
    "qwen3_30b_a3b_pretrain_8gpu_gb200_nvfp4_config": (
        1, 1, 1, None, 8, False, 512, 4, 4096, None, None, False, '79b938f8cbd0'),
    "qwen3_30b_a3b_pretrain_8gpu_gb300_bf16_config": (
        1, 1, 1, None, 8, False, 512, 8, 4096, None, None, False, 'f929320788f7'),
    "qwen3_30b_a3b_pretrain_8gpu_gb300_fp8cs_config": (
        1, 1, 1, None, 8, False, 512, 8, 4096, None, None, False, 'f929320788f7'),
    "qwen3_30b_a3b_pretrain_8gpu_gb300_fp8mx_config": (
        1, 1, 1, None, 8, False, 512, 8, 4096, None, None, False, '65e2e389d0f3'),
    "qwen3_30b_a3b_pretrain_8gpu_gb300_nvfp4_config": (
        1, 1, 1, None, 8, False, 512, 8, 4096, None, None, False, '79b938f8cbd0'),
    "qwen3_30b_a3b_pretrain_8gpu_vr200_bf16_config": (
        1, 1, 1, None, 8, False, 512, 8, 4096, None, None, False, 'f929320788f7'),
    "qwen3_30b_a3b_pretrain_8gpu_vr200_fp8mx_config": (
        1, 1, 1, None, 8, False, 512, 4, 4096, None, None, False, '65e2e389d0f3'),
    "qwen3_30b_a3b_pretrain_8gpu_vr200_nvfp4_config": (
        1, 1, 1, None, 8, False, 512, 8, 4096, None, None, False, '79b938f8cbd0'),
}
