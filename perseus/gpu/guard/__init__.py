"""Owning a GPU's clocks and power limit, and the promise to undo them however the process ends.

The owner (:mod:`.owner`), its state files (:mod:`.files`), the exit and signal hooks that restore
it (:mod:`.restore_hooks`), the watchdog process that restores it after a kill (:mod:`.watchdog`),
and driver calls with a deadline (:mod:`.bounded`).
"""
