#!/usr/bin/env python3
"""Starts a streamed completion with Python's http.client, reads N events,
then hangs up mid-stream (closing the socket without reading the rest), as a
user pressing Ctrl-C would. Prints {"status": ..., "events": [...]} as JSON.

  disconnect_client.py PORT PROMPT MAX_TOKENS N_EVENTS
"""
import http.client
import json
import sys


def main():
    port, prompt, max_tokens, n_events = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "speculation": {"method": "autoregressive"}})
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    events = []
    while len(events) < n_events:
        line = resp.readline()
        if not line:
            break
        line = line.decode().strip()
        if line.startswith("data: "):
            events.append(line[len("data: "):])
    conn.sock.close()  # hang up with the rest of the stream unread
    conn.close()
    print(json.dumps({"status": resp.status, "events": events}))


if __name__ == "__main__":
    main()
