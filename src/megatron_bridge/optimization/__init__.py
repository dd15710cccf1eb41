"""nvidia-modelopt model optimization: quantization-aware training (:mod:`.quantization`), knowledge distillation
(:mod:`.distillation`), and the modelopt state our checkpoints carry (:mod:`.state`).

Importing this package does not import modelopt; the modules that need it import it when called.
"""
