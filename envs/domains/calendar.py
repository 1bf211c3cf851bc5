"""Calendar: people, meeting rooms, events with attendees, and room bookings."""

from __future__ import annotations

import datetime
import random
import re
import sqlite3
from typing import Literal, TypedDict

from envs.base import Domain, ToolError, tool

FIRST = ("Ada", "Bruno", "Carla", "Dmitri", "Elif", "Femi", "Greta", "Hiro", "Ines", "Jamal", "Kaia", "Leo", "Maya")
LAST = ("Andersen", "Baptiste", "Costa", "Dubois", "Eriksen", "Fischer", "Gomez", "Haddad", "Ito", "Jansen")
TEAMS = ("design", "sales", "platform", "finance")
ROOMS = ("Aurora", "Birch", "Cedar", "Delta", "Ember", "Fjord", "Grove", "Harbor")
TITLES = ("Sprint planning", "Budget review", "Design critique", "Customer call", "Team sync", "Hiring debrief",
          "Roadmap review", "Retro", "Vendor demo", "Quarterly update")
STARTS = ("09:00", "09:30", "10:00", "11:00", "13:00", "14:00", "15:30", "16:00")
DURATIONS = (30, 45, 60, 90)
# Weekdays of January 2026 from the fixed "today" on: the dates a request can plan for.
_JAN = [datetime.date(2026, 1, d) for d in range(1, 32)]
DATES = tuple(d.isoformat() for d in _JAN if d.weekday() < 5 and d.isoformat() >= Domain.today)
PAST_DATES = tuple(d.isoformat() for d in _JAN if d.weekday() < 5 and "2026-01-12" <= d.isoformat() < Domain.today)
DAY_START, DAY_END = 7 * 60, 21 * 60  # the building is open 07:00-21:00
UPCOMING = f"status = 'scheduled' AND date >= '{Domain.today}'"


def _values(values: tuple) -> str:
    """SQL listing fixed values, for parameters whose valid values do not come from the state."""
    return "SELECT column1 FROM (VALUES " + ", ".join(f"({v!r})" for v in values) + ")"


def _minutes(hhmm: str) -> int:
    hours, minutes = hhmm.split(":")
    return int(hours) * 60 + int(minutes)


def _room_conflict(
    db: sqlite3.Connection, room_id: str, date: str, start: str, duration: int, exclude: str | None = None
) -> str | None:
    """The scheduled event that already holds the room during this slot, if any."""
    begin, end = _minutes(start), _minutes(start) + duration
    rows = db.execute(
        "SELECT event_id, start_time, duration_min FROM events WHERE room_id = ? AND date = ? "
        "AND status = 'scheduled' AND event_id IS NOT ? ORDER BY start_time, event_id",
        (room_id, date, exclude),
    ).fetchall()
    for event_id, other_start, other_duration in rows:
        if _minutes(other_start) < end and begin < _minutes(other_start) + other_duration:
            return event_id
    return None


class User(TypedDict):
    user_id: str
    name: str
    email: str
    team: str


class Room(TypedDict):
    room_id: str
    name: str
    capacity: int
    floor: int


class EventSummary(TypedDict):
    event_id: str
    title: str
    date: str
    start_time: str
    duration_min: int
    room_id: str | None


class Attendee(TypedDict):
    user_id: str
    response: str


class Event(TypedDict):
    event_id: str
    title: str
    organiser_id: str
    room_id: str | None
    date: str
    start_time: str
    duration_min: int
    status: str
    attendee_count: int
    attendees: list[Attendee]


class Calendar(Domain):
    name = "calendar"
    description = "A shared work calendar: people, meeting rooms, events, invitations and room bookings."
    schema_sql = """
    CREATE TABLE users (user_id TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT UNIQUE NOT NULL,
                        team TEXT NOT NULL);
    CREATE TABLE rooms (room_id TEXT PRIMARY KEY, name TEXT NOT NULL, capacity INTEGER NOT NULL,
                        floor INTEGER NOT NULL);
    CREATE TABLE events (event_id TEXT PRIMARY KEY, title TEXT NOT NULL,
                         organiser_id TEXT NOT NULL REFERENCES users, room_id TEXT REFERENCES rooms,
                         date TEXT NOT NULL, start_time TEXT NOT NULL, duration_min INTEGER NOT NULL,
                         status TEXT NOT NULL);
    CREATE TABLE attendees (event_id TEXT NOT NULL REFERENCES events, user_id TEXT NOT NULL REFERENCES users,
                            response TEXT NOT NULL, PRIMARY KEY (event_id, user_id));
    """
    arg_sources = {
        "email": "SELECT email FROM users",
        "user_id": "SELECT user_id FROM users",
        "event_id": "SELECT event_id FROM events",
        "room_id": "SELECT room_id FROM rooms",
        "date": _values(DATES),
        "start_time": _values(STARTS),
        "duration_min": _values(DURATIONS),
        "title": _values(TITLES[:6]),
        "list_events.user_id": "SELECT DISTINCT a.user_id FROM attendees a JOIN events e USING (event_id) "
        "WHERE e.status = 'scheduled'",
        "invite_attendee.event_id": f"SELECT event_id FROM events WHERE {UPCOMING}",
        "reschedule_event.event_id": f"SELECT event_id FROM events WHERE {UPCOMING}",
        "cancel_event.event_id": f"SELECT event_id FROM events WHERE {UPCOMING}",
        "change_room.event_id": f"SELECT event_id FROM events WHERE {UPCOMING}",
        "remove_attendee.event_id": "SELECT DISTINCT e.event_id FROM events e JOIN attendees a USING (event_id) "
        f"WHERE e.{UPCOMING} AND a.user_id != e.organiser_id",
        "remove_attendee.user_id": "SELECT DISTINCT a.user_id FROM events e JOIN attendees a USING (event_id) "
        f"WHERE e.{UPCOMING} AND a.user_id != e.organiser_id",
        "respond_to_invite.event_id": "SELECT DISTINCT e.event_id FROM events e JOIN attendees a USING (event_id) "
        f"WHERE e.{UPCOMING} AND a.user_id != e.organiser_id",
        "respond_to_invite.user_id": "SELECT DISTINCT a.user_id FROM events e JOIN attendees a USING (event_id) "
        f"WHERE e.{UPCOMING} AND a.user_id != e.organiser_id",
        # Row sources: parameters that must fit together (an invitee *of this event*, a *different* answer).
        "remove_attendee": "SELECT a.event_id, a.user_id FROM events e JOIN attendees a USING (event_id) "
        f"WHERE e.{UPCOMING} AND a.user_id != e.organiser_id ORDER BY a.event_id, a.user_id",
        "respond_to_invite": "SELECT a.event_id, a.user_id, r.column1 AS response "
        "FROM events e JOIN attendees a USING (event_id) "
        "JOIN (VALUES ('accepted'), ('declined')) r ON r.column1 != a.response "
        f"WHERE e.{UPCOMING} AND a.user_id != e.organiser_id ORDER BY a.event_id, a.user_id, response",
        "invite_attendee": "SELECT e.event_id, u.user_id FROM events e CROSS JOIN users u "
        f"WHERE e.{UPCOMING} "
        "AND NOT EXISTS (SELECT 1 FROM attendees a WHERE a.event_id = e.event_id AND a.user_id = u.user_id) "
        "AND (e.room_id IS NULL OR (SELECT COUNT(*) FROM attendees a WHERE a.event_id = e.event_id) "
        "< (SELECT capacity FROM rooms r WHERE r.room_id = e.room_id)) ORDER BY e.event_id, u.user_id",
    }

    @classmethod
    def populate(cls, db: sqlite3.Connection, rng: random.Random) -> None:
        users = []
        for i in range(1, 16):
            first, last = rng.choice(FIRST), rng.choice(LAST)
            uid = f"U{i:04d}"
            users.append(uid)
            db.execute(
                "INSERT INTO users VALUES (?,?,?,?)",
                (uid, f"{first} {last}", f"{first.lower()}.{last.lower()}{i}@example.com", rng.choice(TEAMS)),
            )
        rooms = []
        for i, name in enumerate(ROOMS, start=1):
            rid = f"R{i:04d}"
            rooms.append(rid)
            db.execute(
                "INSERT INTO rooms VALUES (?,?,?,?)", (rid, name, rng.choice((4, 6, 8, 10, 12, 20)), rng.randint(1, 5))
            )
        capacity = dict(db.execute("SELECT room_id, capacity FROM rooms").fetchall())
        for i in range(1, 25):
            eid = f"E{i:04d}"
            organiser = rng.choice(users)
            invitees = rng.sample([u for u in users if u != organiser], rng.randint(1, 3))
            date = rng.choice(PAST_DATES + DATES)
            start, duration = rng.choice(STARTS), rng.choice(DURATIONS)
            status = "cancelled" if rng.random() < 0.12 else "scheduled"
            room = None
            if rng.random() < 0.8:
                for rid in rng.sample(rooms, len(rooms)):
                    if capacity[rid] > len(invitees) and _room_conflict(db, rid, date, start, duration) is None:
                        room = rid
                        break
            db.execute(
                "INSERT INTO events VALUES (?,?,?,?,?,?,?,?)",
                (eid, rng.choice(TITLES), organiser, room, date, start, duration, status),
            )
            db.execute("INSERT INTO attendees VALUES (?,?,?)", (eid, organiser, "accepted"))
            db.executemany(
                "INSERT INTO attendees VALUES (?,?,?)",
                [(eid, u, rng.choice(("pending", "pending", "accepted", "declined"))) for u in invitees],
            )

    # helpers ------------------------------------------------------------------------------------------
    def _check_slot(self, date: str, start_time: str, duration_min: int) -> None:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
            raise ToolError(f"Invalid date {date!r}: use YYYY-MM-DD")
        try:
            datetime.date.fromisoformat(date)
        except ValueError:
            raise ToolError(f"Invalid date {date!r}") from None
        if date < self.today:
            raise ToolError(f"{date} is in the past (today is {self.today})")
        if not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", start_time):
            raise ToolError(f"Invalid start time {start_time!r}: use HH:MM")
        if not 1 <= duration_min <= 480:
            raise ToolError("Duration must be between 1 and 480 minutes")
        if _minutes(start_time) < DAY_START or _minutes(start_time) + duration_min > DAY_END:
            raise ToolError("Events must take place between 07:00 and 21:00")

    def _upcoming(self, event_id: str) -> Event:
        event = self.get_event(event_id)
        if event["status"] == "cancelled":
            raise ToolError(f"Event {event_id} is cancelled")
        if event["date"] < self.today:
            raise ToolError(f"Event {event_id} already took place on {event['date']}")
        return event

    def _check_room(self, room_id: str, date: str, start: str, duration: int, people: int, exclude: str | None) -> None:
        room = self.get_room(room_id)
        if room["capacity"] < people:
            raise ToolError(f"Room {room_id} holds only {room['capacity']} people; the event has {people}")
        clash = _room_conflict(self.db, room_id, date, start, duration, exclude)
        if clash is not None:
            raise ToolError(f"Room {room_id} is already booked by event {clash} at that time")

    def _user(self, user_id: str) -> User:
        return self.one("SELECT * FROM users WHERE user_id = ?", user_id, missing="User not found")

    # reads --------------------------------------------------------------------------------------------
    @tool(mutates=False, phrase="look up the colleague with email {email}", answer="user_id")
    def find_user_by_email(self, email: str) -> User:
        """Find a user by their email address.

        Args:
            email: The user's email, e.g. "ada.costa1@example.com".
        """
        return self.one("SELECT * FROM users WHERE lower(email) = lower(?)", email, missing="User not found")

    @tool(mutates=False, phrase="list the meetings of user {user_id}", answer="#")
    def list_events(self, user_id: str, date: str | None = None) -> list[EventSummary]:
        """List the scheduled events a user organises or attends, earliest first.

        Args:
            user_id: The user id, e.g. "U0001".
            date: Only events on this day (YYYY-MM-DD), e.g. "2026-01-20"; all days if omitted.
        """
        self._user(user_id)
        return self.all(
            "SELECT e.event_id, e.title, e.date, e.start_time, e.duration_min, e.room_id FROM events e "
            "JOIN attendees a USING (event_id) WHERE a.user_id = ? AND e.status = 'scheduled' "
            "AND (? IS NULL OR e.date = ?) ORDER BY e.date, e.start_time, e.event_id",
            user_id, date, date,
        )

    @tool(mutates=False, phrase="get the details of event {event_id}", answer="start_time")
    def get_event(self, event_id: str) -> Event:
        """Get an event with its room, time and attendees.

        Args:
            event_id: The event id, e.g. "E0001".
        """
        event = self.one("SELECT * FROM events WHERE event_id = ?", event_id, missing="Event not found")
        event["attendees"] = self.all(
            "SELECT user_id, response FROM attendees WHERE event_id = ? ORDER BY user_id", event_id
        )
        event["attendee_count"] = len(event["attendees"])
        return event

    @tool(mutates=False, phrase="get the details of room {room_id}", answer="capacity")
    def get_room(self, room_id: str) -> Room:
        """Get a meeting room's name, capacity and floor.

        Args:
            room_id: The room id, e.g. "R0001".
        """
        return self.one("SELECT * FROM rooms WHERE room_id = ?", room_id, missing="Room not found")

    @tool(mutates=False, phrase="find a free room for {capacity} people on {date} at {start_time}", answer="#")
    def find_free_rooms(self, date: str, start_time: str, capacity: int, duration_min: int = 60) -> list[Room]:
        """List the rooms big enough and free for a time slot, smallest first.

        Args:
            date: The day (YYYY-MM-DD), e.g. "2026-01-20".
            start_time: Start of the slot (HH:MM, 24h), e.g. "14:00".
            capacity: How many people the room must hold, e.g. 6.
            duration_min: Length of the slot in minutes, e.g. 60.
        """
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
            raise ToolError(f"Invalid date {date!r}: use YYYY-MM-DD")
        if not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", start_time):
            raise ToolError(f"Invalid start time {start_time!r}: use HH:MM")
        if capacity < 1:
            raise ToolError("Capacity must be at least 1")
        if not 1 <= duration_min <= 480:
            raise ToolError("Duration must be between 1 and 480 minutes")
        rooms = self.all("SELECT * FROM rooms WHERE capacity >= ? ORDER BY capacity, room_id", capacity)
        return [r for r in rooms if _room_conflict(self.db, r["room_id"], date, start_time, duration_min) is None]

    # writes -------------------------------------------------------------------------------------------
    @tool(mutates=True, phrase="schedule '{title}' for user {user_id} on {date} at {start_time}", answer="event_id")
    def create_event(
        self, user_id: str, title: str, date: str, start_time: str, duration_min: int = 60, room_id: str | None = None
    ) -> Event:
        """Create an event organised by a user, optionally booking a room.

        Args:
            user_id: The organiser's user id, e.g. "U0001".
            title: The event title, e.g. "Budget review".
            date: The day (YYYY-MM-DD), e.g. "2026-01-20".
            start_time: Start time (HH:MM, 24h), e.g. "14:00".
            duration_min: Length in minutes, e.g. 60.
            room_id: Room to book, e.g. "R0001"; no room if omitted.
        """
        self._user(user_id)
        if not title.strip():
            raise ToolError("The title must not be empty")
        self._check_slot(date, start_time, duration_min)
        if room_id is not None:
            self._check_room(room_id, date, start_time, duration_min, 1, None)
        eid = self.next_id("events", "event_id", "E")
        self.db.execute(
            "INSERT INTO events VALUES (?,?,?,?,?,?,?,?)",
            (eid, title.strip(), user_id, room_id, date, start_time, duration_min, "scheduled"),
        )
        self.db.execute("INSERT INTO attendees VALUES (?,?,?)", (eid, user_id, "accepted"))
        return self.get_event(eid)

    @tool(mutates=True, phrase="invite user {user_id} to event {event_id}", answer="attendee_count")
    def invite_attendee(self, event_id: str, user_id: str) -> Event:
        """Invite a user to an upcoming event; the room, if any, must have space.

        Args:
            event_id: The event id, e.g. "E0001".
            user_id: The user to invite, e.g. "U0002".
        """
        event = self._upcoming(event_id)
        self._user(user_id)
        if any(a["user_id"] == user_id for a in event["attendees"]):
            raise ToolError(f"User {user_id} is already invited to event {event_id}")
        if event["room_id"] is not None:
            room = self.get_room(event["room_id"])
            if event["attendee_count"] >= room["capacity"]:
                raise ToolError(f"Room {room['room_id']} is full ({room['capacity']} people)")
        self.db.execute("INSERT INTO attendees VALUES (?,?,?)", (event_id, user_id, "pending"))
        return self.get_event(event_id)

    @tool(mutates=True, phrase="remove user {user_id} from event {event_id}", answer="attendee_count")
    def remove_attendee(self, event_id: str, user_id: str) -> Event:
        """Remove an invited user from an upcoming event (the organiser cannot be removed).

        Args:
            event_id: The event id, e.g. "E0001".
            user_id: The attendee to remove, e.g. "U0002".
        """
        event = self._upcoming(event_id)
        if user_id == event["organiser_id"]:
            raise ToolError("The organiser cannot be removed from their own event")
        if not any(a["user_id"] == user_id for a in event["attendees"]):
            raise ToolError(f"User {user_id} is not invited to event {event_id}")
        self.db.execute("DELETE FROM attendees WHERE event_id = ? AND user_id = ?", (event_id, user_id))
        return self.get_event(event_id)

    @tool(mutates=True, phrase="answer the invitation to event {event_id} for user {user_id}: {response}",
          answer="response")
    def respond_to_invite(self, event_id: str, user_id: str, response: Literal["accepted", "declined"]) -> Attendee:
        """Accept or decline an invitation to an upcoming event.

        Args:
            event_id: The event id, e.g. "E0001".
            user_id: The invited user's id, e.g. "U0002".
            response: The answer to the invitation.
        """
        event = self._upcoming(event_id)
        current = next((a for a in event["attendees"] if a["user_id"] == user_id), None)
        if current is None:
            raise ToolError(f"User {user_id} is not invited to event {event_id}")
        if user_id == event["organiser_id"]:
            raise ToolError("The organiser does not answer their own invitation")
        if current["response"] == response:
            raise ToolError(f"User {user_id} has already {response} this invitation")
        self.db.execute(
            "UPDATE attendees SET response = ? WHERE event_id = ? AND user_id = ?", (response, event_id, user_id)
        )
        return {"user_id": user_id, "response": response}

    @tool(mutates=True, phrase="move event {event_id} to {date} at {start_time}", answer="date")
    def reschedule_event(self, event_id: str, date: str, start_time: str) -> Event:
        """Move an upcoming event to another day or time, keeping its length and room.

        Args:
            event_id: The event id, e.g. "E0001".
            date: The new day (YYYY-MM-DD), e.g. "2026-01-21".
            start_time: The new start time (HH:MM, 24h), e.g. "10:00".
        """
        event = self._upcoming(event_id)
        if event["date"] == date and event["start_time"] == start_time:
            raise ToolError(f"Event {event_id} is already on {date} at {start_time}")
        self._check_slot(date, start_time, event["duration_min"])
        if event["room_id"] is not None:
            self._check_room(event["room_id"], date, start_time, event["duration_min"], event["attendee_count"],
                             event_id)
        self.db.execute(
            "UPDATE events SET date = ?, start_time = ? WHERE event_id = ?", (date, start_time, event_id)
        )
        return self.get_event(event_id)

    @tool(mutates=True, phrase="cancel event {event_id}", answer="status")
    def cancel_event(self, event_id: str) -> Event:
        """Cancel an upcoming event; its room becomes free.

        Args:
            event_id: The event id, e.g. "E0001".
        """
        self._upcoming(event_id)
        self.db.execute("UPDATE events SET status = 'cancelled' WHERE event_id = ?", (event_id,))
        return self.get_event(event_id)

    @tool(mutates=True, phrase="book room {room_id} for event {event_id}", answer="room_id")
    def change_room(self, event_id: str, room_id: str) -> Event:
        """Book a room for an upcoming event, replacing its current room if it has one.

        Args:
            event_id: The event id, e.g. "E0001".
            room_id: The room to book, e.g. "R0002".
        """
        event = self._upcoming(event_id)
        if event["room_id"] == room_id:
            raise ToolError(f"Event {event_id} is already in room {room_id}")
        self._check_room(room_id, event["date"], event["start_time"], event["duration_min"], event["attendee_count"],
                         event_id)
        self.db.execute("UPDATE events SET room_id = ? WHERE event_id = ?", (room_id, event_id))
        return self.get_event(event_id)
