"""Use cases every entry point shares (API, CLI, console, proxy, scheduler).

Vocabulary: ``get``, ``list``, ``create``, ``update``, ``delete``, keyword-only arguments, a ``Tx``
first. Services never commit: the caller opened the transaction and owns it.
"""
