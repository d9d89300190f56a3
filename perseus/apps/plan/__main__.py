"""``python -m perseus.apps.plan``: the ``perseus-plan`` command."""

from perseus.apps.plan.command import main

main()
