"""The profile table on disk: time and energy per stage, instruction and clock.

The CSV format (:mod:`.table`), the checks of its fields (:mod:`.fields`), and the documented rule
for a schedule that splits the backward where none was measured (:mod:`.split`).
"""
