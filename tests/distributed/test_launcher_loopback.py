"""The launcher's warning for a --master_addr host name that resolves to loopback here (other nodes could not
reach the store): given for any such name, including those sorting before "localhost"."""

from infinitrain import run


def test_loopback_warning_for_any_host_name(monkeypatch, capsys):
    """A --master_addr host name (other than "localhost") resolving to a loopback address is warned about,
    whatever it sorts like; a non-loopback one is not."""
    for name, addr, warned in (
        ("box", "127.0.1.1", True),
        ("zeta-node", "127.0.1.1", True),
        ("box", "10.0.0.7", False),
    ):
        monkeypatch.setattr(run.socket, "gethostbyname", lambda n, a=addr: a)
        run._warn_if_loopback(name)
        err = capsys.readouterr().err
        assert ("loopback" in err) == warned, (name, addr, err)
