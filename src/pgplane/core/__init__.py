"""Pure domain: identifiers, time, records and the operation state machine. No I/O."""
