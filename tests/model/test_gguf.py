"""The GGUF converter's errors (the conversion itself runs in tests/workflow/test_llamacpp_e2e.py)."""

import pytest

from filledfirst.errors import UserError
from filledfirst.model.gguf import outtype, write_gguf


def test_a_missing_converter_says_how_to_get_it(tmp_path):
    with pytest.raises(UserError, match="make install"):
        write_gguf(tmp_path / "m", tmp_path / "m.gguf", converter_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_a_failed_conversion_leaves_nothing(tmp_path):
    converter = tmp_path / "converter"
    converter.mkdir()
    (converter / "convert_hf_to_gguf.py").write_text("import sys\ndef main():\n    sys.exit('no model here')\n")
    (converter / "conversion").mkdir()
    (converter / "conversion" / "__init__.py").write_text("")
    (converter / "conversion" / "base.py").write_text("class TextModel:\n    pass\n")
    out = tmp_path / "out" / "m.gguf"
    with pytest.raises(UserError, match="no model here"):
        write_gguf(tmp_path / "m", out, converter_dir=converter)
    assert list(out.parent.iterdir()) == []  # the temporary file is gone, no m.gguf


def test_the_weights_keep_the_models_dtype():
    assert (outtype("float32"), outtype("bfloat16"), outtype("float16"), outtype("auto")) == ("f32", "bf16", "f16",
                                                                                             "f32")
