"""The embedded broker never hands a reader half a message (issue 49: a worker polling the
folder broker died on JSONDecodeError reading a message still being written)."""

import builtins

from kombu import Connection

from tuneplane import broker


def test_a_message_is_written_under_a_name_no_reader_takes_then_renamed_whole(
    tmp_path, monkeypatch
):
    options = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path)}
    options["control_folder"] = str(tmp_path / "control")
    opened = []

    def recording_open(path, *args, **kwargs):
        opened.append(str(path))
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(broker, "open", recording_open, raising=False)
    with Connection(f"{broker.ALIAS}://", transport_options=options) as connection:
        queue = connection.SimpleQueue("q")
        # A message another process is still writing: no reader takes it.
        (tmp_path / "1_half.q.msg.part").write_bytes(b'{"body": "half')
        queue.put({"text": "x" * 100_000})
        assert opened and all(name.endswith(".msg.part") for name in opened)
        message = queue.get(timeout=5)
        assert len(message.payload["text"]) == 100_000
        message.ack()
        try:
            queue.get(timeout=0.5)
        except queue.Empty:
            pass
        else:
            raise AssertionError("a part-written message was read")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["1_half.q.msg.part", "control"]
