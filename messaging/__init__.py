"""Messaging primitives shared by the swiftlets: the AMQP 1.0 type codec, the message
model and JMS selectors. Pure libraries (no I/O, no swiftlet, no kernel): the store, the
queue and topic managers, the JMS listener and routing all use them."""
