"""paxlite.pretrained.pretrained_models: what ``save_pretrained`` writes takes the process's
umask (its weights, config, generation config and tokenizer copies)."""

from paxlite.pretrained.loading import from_pretrained
from tests import FIXTURES
from tests.paxlite.formats.hf.test_checkpoint import assert_written_with_umask


def test_saved_files_take_the_umask(tmp_path):
    lm = from_pretrained(FIXTURES / "hf" / "llama3")
    out, files = tmp_path / "saved", []
    assert_written_with_umask(lambda: files.extend(lm.save_pretrained(out)), out)
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= set(
        files
    )
