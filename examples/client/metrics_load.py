"""Steady load for the metrics walkthrough (docs/spark.md, "The pipeline"): RATE messages a second
for SECONDS seconds to ADDRESS, through the router at URL.

    python examples/client/metrics_load.py amqp://127.0.0.1:5682 orders@paris 50 60
"""

import sys
import time

from martinet.messaging.client import Queue, TextMessage
from martinet.messaging.client.blocking import BlockingConnection

url, address, rate, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
with BlockingConnection(url) as connection:
    producer = connection.session().producer(Queue(address))
    start = time.monotonic()
    for n in range(int(rate * seconds)):
        time.sleep(max(0.0, start + n / rate - time.monotonic()))
        producer.send(TextMessage(f"message {n}"))
print(f"sent {int(rate * seconds)} messages to {address}")
