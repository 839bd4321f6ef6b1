"""The tiny VL model's processor: Qwen2.5-VL's, for images only (copied into the model folder as remote code).

transformers builds Qwen-VL's video processor with torchvision, which this project does not install; this subclass
keeps the image processor and the tokenizer and takes no video processor. It keeps the class name, so that verl's
``hf_processor`` binds Qwen2.5-VL's ``get_rope_index`` (3-D mrope positions) to it. Load with
``AutoProcessor.from_pretrained(DIR, trust_remote_code=True)``.
"""

from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor as _QwenVLProcessor
from transformers.processing_utils import ProcessorMixin


class Qwen2_5_VLProcessor(_QwenVLProcessor):  # noqa: N801 - verl matches the class by this name
    """Qwen2.5-VL's processor without a video processor (images and text only)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
        self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
