"""``sys$jms`` (in progress, issue 5): the AMQP 1.0 listener with JMS semantics.

So far: :mod:`.sasl`, the server side of SASL (ANONYMOUS, PLAIN) that runs in front of the
AMQP engine. The listener itself is not registered as a swiftlet yet.
"""
