#!/usr/bin/env python3
"""Starts a completion with Python's http.client and hangs up mid-request,
as a user pressing Ctrl-C would: with N_EVENTS > 0 a streamed one, after
reading N_EVENTS events (closing the socket with the rest unread); with
N_EVENTS = 0 a non-streamed one, right after sending it. Prints
{"status": ..., "events": [...]} as JSON (status 0 when not read).

  disconnect_client.py PORT PROMPT MAX_TOKENS N_EVENTS
"""
import http.client
import json
import sys


def main():
    port, prompt, max_tokens, n_events = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": n_events > 0,
                       "speculation": {"method": "autoregressive"}})
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    if n_events == 0:
        conn.sock.close()  # hang up while the server generates
        conn.close()
        print(json.dumps({"status": 0, "events": []}))
        return
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
