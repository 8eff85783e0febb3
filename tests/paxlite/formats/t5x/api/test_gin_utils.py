"""T5X's config summary: the text a run writes to MODEL_DIR/config.gin is gin's own."""

import gin

from paxlite.formats.t5x.api import gin_utils


def test_the_summary_is_gin_s_config_string():
    gin.clear_config()
    try:
        gin.parse_config("gin_utils_test_macro = 3")
        text = gin_utils.summarize_gin_config("/unused")
        assert text == gin.config_str()
        assert "gin_utils_test_macro = 3" in text
    finally:
        gin.clear_config()
    assert gin_utils.CONFIG_FILE == "config.gin"
