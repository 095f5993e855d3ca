"""Who hears of a command's change: placement, for its members (DESIGN §7: nodes carries the
reports and never imports placement). Each observer is called inside the transaction that
stored the change, with the command as it is now and what it was before."""

from collections.abc import Callable

CommandObserver = Callable[..., None]
_observers: list[CommandObserver] = []


def register_command_observer(observer: CommandObserver) -> CommandObserver:
    if observer not in _observers:
        _observers.append(observer)
    return observer


def command_changed(command, before: dict) -> None:
    for observer in _observers:
        observer(command, before)
