"""Fresh initial states for BFCL's 8 multi-turn classes, one per seed: the factory of ``--objects bfcl``.

BFCL's entries load each class from an ``initial_config`` dict through ``_load_scenario``; this module writes
dicts of the same shapes (a file tree, a tweet feed, an inbox, a ticket queue, a brokerage account, cards and
bookings, a car's dashboard) from its own vocabulary, drawn by the seed, so synthesized tasks start from states
no BFCL entry holds. :func:`initial_configs` is plain data (standard library only, safe to call anywhere);
:func:`make_instances` instantiates BFCL's classes and is called only inside the object worker's sandbox, where
the pinned bfcl-eval folder is on the path (``generators.bfcl_synth``).
"""

import random

CLASS_MODULES = {"GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api", "MessageAPI": "message_api",
                 "TwitterAPI": "posting_api", "TicketAPI": "ticket_api", "TradingBot": "trading_bot",
                 "TravelAPI": "travel_booking", "VehicleControlAPI": "vehicle_control"}
PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
STATELESS = ("MathAPI",)

# our own words: values that BFCL's entries do not use, so a synthesized call is not a copied one
_TOPICS = ("heron", "basalt", "quill", "marigold", "tundra", "cobalt", "juniper", "sextant", "lagoon", "ember",
           "walnut", "zephyr", "saffron", "granite", "willow", "pylon")
_KINDS = ("minutes", "ledger", "sketch", "roster", "survey", "outline", "tally", "memo", "digest", "inventory")
_EXTS = ("txt", "md", "csv", "log")
_FOLDERS = ("drafts", "scans", "receipts", "fieldwork", "backups", "slides", "invoices", "recipes", "maps",
            "letters")
_OWNERS = ("oriel", "tamsin", "bexley", "corwin", "ysolde", "hadley", "perrin", "linnea")
_PEOPLE = ("Odile", "Ferris", "Anouk", "Tobiah", "Marisol", "Kestrel", "Ilse", "Caspian", "Winnie", "Rafferty")
_SURNAMES = ("Vantongeren", "Okonkwo-Reyes", "Halvorsen", "Quintero", "Abernathy", "Lindqvist")
_SENTENCES = ("the pump at the north field needs a new gasket", "count the crates twice before signing",
              "tide tables were updated for the spring", "the east stairwell light flickers again",
              "bring the blue folder to the review", "the kiln reached its target slowly",
              "volunteers meet by the old boathouse", "the budget line for paint is exhausted",
              "ferry schedule changes after the holiday", "check the humidity log every morning")
_HASHTAGS = ("#fieldnotes", "#tidewatch", "#kilnlife", "#quietwins", "#boathouse", "#springcount")
_TICKETS = ("wobbly desk in room 4", "printer jams on duplex", "badge reader offline", "leaking radiator",
            "projector colour shift", "shared drive is slow", "door closer broken", "ceiling tile stained")
_SYMBOLS = ("QRLX", "BVNT", "HZMA", "TKRO", "WELD", "CAPY", "MOSK", "FENR", "LUMB", "ZOLA")
_CITIES = ("Crescent Hollow", "Port Wendell", "Silverford", "Marrowdale", "Quillmoor", "Eastbrine")


def _file_tree(rng):
    def file_entry():
        lines = rng.sample(_SENTENCES, rng.randint(1, 4))
        return {"type": "file", "content": "\n".join(lines)}

    def names(n):
        out = set()
        while len(out) < n:
            out.add(f"{rng.choice(_TOPICS)}_{rng.choice(_KINDS)}.{rng.choice(_EXTS)}")
        return sorted(out)

    contents = {name: file_entry() for name in names(rng.randint(3, 5))}
    for folder in rng.sample(_FOLDERS, rng.randint(1, 3)):
        contents[folder] = {"type": "directory",
                            "contents": {name: file_entry() for name in names(rng.randint(0, 3))}}
    return {"root": {rng.choice(_OWNERS): {"type": "directory", "contents": contents}}}


def _twitter(rng):
    user = f"{rng.choice(_OWNERS)}_{rng.choice(_TOPICS)}"
    others = [f"{o}_{t}" for o, t in zip(rng.sample(_OWNERS, 3), rng.sample(_TOPICS, 3)) if o not in user]
    tweets = {}
    for i in range(rng.randint(2, 5)):
        tweets[str(i)] = {"id": i, "username": user, "content": rng.choice(_SENTENCES).capitalize() + ".",
                          "tags": rng.sample(_HASHTAGS, rng.randint(0, 2)), "mentions": []}
    return {"username": user, "password": f"{rng.choice(_TOPICS)}-{rng.randrange(1000, 9999)}",
            "authenticated": True, "tweets": tweets, "comments": {}, "retweets": {},
            "following_list": others[:rng.randint(0, len(others))], "tweet_counter": len(tweets)}


def _messages(rng):
    people = rng.sample(_PEOPLE, rng.randint(3, 5))
    ids = {p: f"USR{100 + i * rng.randint(3, 9):03d}" for i, p in enumerate(people)}
    me = ids[people[0]]
    inbox = [{ids[p]: rng.choice(_SENTENCES).capitalize() + "."} for p in rng.sample(people[1:], rng.randint(1, len(people) - 1))]
    return {"user_count": len(people), "user_map": ids, "inbox": inbox, "message_count": len(inbox),
            "current_user": me}


def _tickets(rng):
    me = f"{rng.choice(_PEOPLE)} {rng.choice(_SURNAMES)}"
    queue = []
    start = rng.randrange(200, 900)
    for i, title in enumerate(rng.sample(_TICKETS, rng.randint(2, 4))):
        queue.append({"id": start + i, "title": title, "description": rng.choice(_SENTENCES).capitalize() + ".",
                      "status": rng.choice(["open", "open", "closed"]), "priority": rng.randint(1, 5),
                      "created_by": me})
    return {"ticket_queue": queue, "ticket_counter": start + len(queue), "current_user": me}


def _trading(rng):
    symbols = rng.sample(_SYMBOLS, rng.randint(4, 7))
    stocks = {}
    for s in symbols:
        price = round(rng.uniform(12, 900), 2)
        stocks[s] = {"price": price, "percent_change": round(rng.uniform(-2, 2), 2),
                     "volume": round(rng.uniform(0.2, 4), 3), "MA(5)": round(price * rng.uniform(0.97, 1.03), 2),
                     "MA(20)": round(price * rng.uniform(0.95, 1.05), 2)}
    first = rng.randrange(30000, 60000)
    orders = {}
    for k in range(rng.randint(1, 3)):
        s = rng.choice(symbols)
        orders[str(first + k)] = {"id": first + k, "order_type": rng.choice(["Buy", "Sell"]), "symbol": s,
                                  "price": stocks[s]["price"], "amount": rng.randint(1, 40),
                                  "status": rng.choice(["Open", "Pending", "Completed"])}
    return {"orders": orders, "account_info": {"account_id": rng.randrange(70000, 99999),
                                               "balance": float(rng.randrange(2000, 60000, 250)),
                                               "binding_card": rng.randrange(10**15, 10**16)},
            "authenticated": True, "market_status": rng.choice(["Open", "Closed"]), "order_counter": first + 3,
            "stocks": stocks, "watch_list": rng.sample(symbols, rng.randint(0, 2)), "transaction_history": [],
            "random_seed": rng.randrange(10**6)}


def _travel(rng):
    first, last = rng.choice(_PEOPLE), rng.choice(_SURNAMES)
    cards = {}
    for _ in range(rng.randint(1, 3)):
        card = f"card{rng.randrange(1000, 9999)}"
        cards[card] = {"card_number": "-".join(f"{rng.randrange(10000):04d}" for _ in range(4)),
                       "expiration_date": f"{rng.randint(1, 12):02d}/{rng.randint(2027, 2031)}",
                       "cardholder_name": f"{first} {last}", "card_verification_number": rng.randrange(100, 999),
                       "balance": float(rng.randrange(500, 20000, 50))}
    bookings = {}
    for _ in range(rng.randint(1, 3)):
        bookings[f"bk{rng.randrange(10000, 99999)}"] = {
            "card_id": rng.choice(sorted(cards)), "travel_date": f"2027-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            "travel_from": rng.choice(["SFO", "LAX", "JFK", "ORD", "BOS"]),
            "travel_to": rng.choice(["SEA", "ATL", "DFW", "MIA", "DEN"]), "travel_class": rng.choice(["economy", "business"]),
            "travel_cost": float(rng.randrange(150, 2500, 5)), "transaction_id": str(rng.randrange(10**7, 10**8))}
    return {"credit_card_list": cards, "booking_record": bookings,
            "access_token": f"tok{rng.randrange(10**6, 10**7)}", "token_type": "Bearer", "token_expires_in": 7200,
            "token_scope": "read_write", "user_first_name": first, "user_last_name": last,
            "budget_limit": float(rng.randrange(1000, 9000, 100)), "random_seed": rng.randrange(10**6)}


def _vehicle(rng):
    locked = {d: rng.choice(["locked", "unlocked"]) for d in ("driver", "passenger", "rear_left", "rear_right")}
    return {"fuelLevel": round(rng.uniform(2, 48), 1), "batteryVoltage": round(rng.uniform(11.8, 13.2), 1),
            "engineState": "stopped", "doorStatus": locked, "acTemperature": float(rng.randint(16, 27)),
            "fanSpeed": rng.randrange(0, 101, 10), "acMode": rng.choice(["auto", "cool", "heat"]),
            "humidityLevel": float(rng.randint(20, 70)), "headLightStatus": rng.choice(["on", "off"]),
            "parkingBrakeStatus": rng.choice(["engaged", "released"]), "parkingBrakeForce": 0.0, "slopeAngle": 0.0,
            "distanceToNextVehicle": float(rng.randrange(20, 120, 5)), "cruiseStatus": "inactive",
            "destination": rng.choice(_CITIES),
            **{f"{w}TirePressure": float(rng.randint(26, 38)) for w in ("frontLeft", "frontRight", "rearLeft", "rearRight")}}


# values for parameters no state holds (a new file's name, a message's text), by ``tool.param`` or ``param``
VALUES = {
    "touch.file_name": [f"{t}_{k}.txt" for t, k in zip(_TOPICS[::3], _KINDS)],
    "echo.file_name": [f"{t}_{k}.md" for t, k in zip(_TOPICS[1::3], _KINDS[2:])],
    "mkdir.dir_name": ["archive_2027", "to_sort", "shared_notes", "old_scans"],
    "echo.content": [s.capitalize() + "." for s in _SENTENCES[:5]],
    "grep.pattern": ["pump", "crates", "budget", "humidity", "ferry", "kiln"],
    "find.name": ["memo", "ledger", "survey"],
    "mv.destination": ["renamed_notes.txt", "final_tally.csv", "for_review.md"],
    "cp.destination": ["copy_of_notes.txt", "backup_tally.csv"],
    "content": [s.capitalize() + "!" for s in _SENTENCES[5:]],
    "message": ["Can we move the review to Thursday?", "The crates arrived this morning.",
                "Please send me the humidity log."],
    "keyword": ["crates", "humidity", "review", "ferry"],
    "comment_content": ["Nice work on this!", "Could you share the source?"],
    "title": ["Broken window latch", "Wi-Fi drops in the lab", "Coffee machine error E4"],
    "description": ["Started on Monday morning.", "Happens every afternoon."],
    "resolution": ["Replaced the part.", "Restarted the service and confirmed it works."],
    "user_name": ["Leopold", "Sunniva", "Bartholomew"],
    "sector": ["Technology", "Automobile"],
    "tags": [["#fieldnotes"], ["#quietwins", "#springcount"]],
    "mentions": [["@perrin_quill"]],
    "location": list(_CITIES[:3]),
    "city": list(_CITIES[:3]),
    "cityA": ["83214", "61820"],
    "cityB": ["02140", "94016"],
    "destination": list(_CITIES[3:]),
    "messages": [["Tyre check done"], ["Left for the depot", "Fuel topped up"]],
    # numbers in the ranges the classes accept (a pedal position is 0-1, a tank holds 50 gallons)
    "pedalPosition": [1.0, 0.6],
    "fuelAmount": [4.5, 12.0],
    "speed": [45.0, 65.0],
    "distanceToNextVehicle": [60.0, 85.0],
    "temperature": [19.5, 23.0],
    "travel_date": ["2027-04-18", "2027-09-02"],
    "expiration_date": ["08/2029"],
    "card_number": ["4111-2043-8876-1290"],
    "cardholder_name": ["Odile Halvorsen"],
    "card_verification_number": [482],
}
# parameters that take what another one takes (``mv``'s ``source`` is a file's name)
ALIASES = {"mv.source": "file_name", "cp.source": "file_name", "mv.destination": "folder",
           "cp.destination": "folder", "find.path": "folder", "sort.file_name": "file_name",
           "username_to_follow": "username", "username_to_unfollow": "username"}

_MAKERS = {"GorillaFileSystem": _file_tree, "TwitterAPI": _twitter, "MessageAPI": _messages, "TicketAPI": _tickets,
           "TradingBot": _trading, "TravelAPI": _travel, "VehicleControlAPI": _vehicle}


def initial_configs(seed):
    """``{class: initial_config}`` for every stateful class (MathAPI has none), drawn from ``seed``."""
    return {cls: make(random.Random(f"bfcl-states/{seed}/{cls}")) for cls, make in _MAKERS.items()}


def make_instances(seed):
    """The 8 classes, each loaded with its config for ``seed``: ``{class name: instance}``. Worker side only."""
    import importlib

    configs = initial_configs(seed)
    instances = {}
    for cls, module in CLASS_MODULES.items():
        instance = getattr(importlib.import_module(f"{PACKAGE}.{module}"), cls)()
        if cls not in STATELESS:
            instance._load_scenario(configs[cls], long_context=False)
        instances[cls] = instance
    return instances
