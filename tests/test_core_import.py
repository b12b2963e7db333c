import pagedcore._core as _core


def test_extension_loads_and_reports_build():
    assert isinstance(_core.has_cuda, bool)
    assert _core.NULL_BLOCK == -1
    assert _core.PAD_SLOT == -1
