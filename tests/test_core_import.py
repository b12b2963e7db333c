import pagedcore._core as _core


def test_extension_loads_and_reports_build():
    assert isinstance(_core.has_cuda, bool)
    assert _core.NULL_BLOCK == -1
    assert _core.PAD_SLOT == -1


def test_ops_fail_loudly_without_the_extension():
    # The extension is built with the package: an op module must not import without it (no silent
    # torch fallback), and the message must name the missing module.
    import subprocess
    import sys

    code = ("import sys; sys.modules['pagedcore._core'] = None\n"
            "import importlib\n"
            "for name in ('attention', 'attention_cuda', 'nccl', 'linear', 'elementwise'):\n"
            "    try:\n"
            "        importlib.import_module('pagedcore.ops.' + name)\n"
            "    except ImportError as error:\n"
            "        assert 'pagedcore._core' in str(error), error\n"
            "    else:\n"
            "        raise SystemExit(f'pagedcore.ops.{name} imported without pagedcore._core')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
