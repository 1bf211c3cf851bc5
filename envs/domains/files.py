"""Files: a cloud drive with users, nested folders, files and per-user shares."""

from __future__ import annotations

import random
import sqlite3
from typing import Literal, TypedDict

from envs.base import Domain, ToolError, tool

FIRST = ("Aiko", "Bram", "Cleo", "Diego", "Esme", "Filip", "Gaia", "Hamid", "Isla", "Joon", "Kira", "Lars")
LAST = ("Abe", "Bakker", "Cruz", "Dahl", "Engel", "Ferreira", "Gil", "Hansen", "Ivanova", "Jung")
SUBFOLDERS = ("Documents", "Photos", "Projects", "Receipts", "Music", "Work")
STEMS = ("report", "budget", "invoice", "photo", "notes", "slides", "contract", "plan", "summary", "draft")
EXTENSIONS = ("pdf", "docx", "xlsx", "png", "txt", "csv")
NEW_FOLDERS = ("Archive", "Invoices 2026", "Travel", "Shared", "Drafts")
NEW_NAMES = ("final_report.pdf", "budget_2026.xlsx", "meeting_notes.txt", "team_photo.png", "contract_signed.pdf")
QUOTA_KB = 50_000


def _values(values: tuple) -> str:
    """SQL listing fixed values, for parameters whose valid values do not come from the state."""
    return "SELECT column1 FROM (VALUES " + ", ".join(f"({v!r})" for v in values) + ")"


class User(TypedDict):
    user_id: str
    name: str
    email: str


class Folder(TypedDict):
    folder_id: str
    owner_id: str
    parent_id: str | None
    name: str


class FileInfo(TypedDict):
    file_id: str
    folder_id: str
    name: str
    size_kb: int
    modified: str


class Share(TypedDict):
    file_id: str
    user_id: str
    permission: str


class SharedWith(TypedDict):
    user_id: str
    permission: str


class FileDetail(TypedDict):
    file_id: str
    folder_id: str
    owner_id: str
    name: str
    size_kb: int
    modified: str
    share_count: int
    shared_with: list[SharedWith]


class Deleted(TypedDict):
    file_id: str
    name: str
    status: str
    shares_removed: int


class Usage(TypedDict):
    user_id: str
    file_count: int
    total_kb: int
    quota_kb: int
    free_kb: int


class Files(Domain):
    name = "files"
    description = "A cloud drive: users, nested folders, files and sharing with other users."
    schema_sql = """
    CREATE TABLE users (user_id TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT UNIQUE NOT NULL);
    CREATE TABLE folders (folder_id TEXT PRIMARY KEY, owner_id TEXT NOT NULL REFERENCES users,
                          parent_id TEXT REFERENCES folders, name TEXT NOT NULL);
    CREATE TABLE files (file_id TEXT PRIMARY KEY, folder_id TEXT NOT NULL REFERENCES folders, name TEXT NOT NULL,
                        size_kb INTEGER NOT NULL, modified TEXT NOT NULL);
    CREATE TABLE shares (file_id TEXT NOT NULL REFERENCES files, user_id TEXT NOT NULL REFERENCES users,
                         permission TEXT NOT NULL CHECK (permission IN ('read', 'write')),
                         PRIMARY KEY (file_id, user_id));
    """
    arg_sources = {
        "email": "SELECT email FROM users",
        "user_id": "SELECT user_id FROM users",
        "folder_id": "SELECT folder_id FROM folders",
        "parent_id": "SELECT folder_id FROM folders",
        "file_id": "SELECT file_id FROM files",
        "name": _values(NEW_FOLDERS),
        "new_name": _values(NEW_NAMES),
        "name_contains": _values(STEMS[:6]),
        "extension": _values(EXTENSIONS),
        "list_folder.folder_id": "SELECT DISTINCT folder_id FROM files",
        "search_files.user_id": "SELECT DISTINCT d.owner_id FROM files f JOIN folders d USING (folder_id)",
        "unshare_file.file_id": "SELECT DISTINCT file_id FROM shares",
        "unshare_file.user_id": "SELECT DISTINCT user_id FROM shares",
        # Row sources: parameters that must fit together (a folder of the file's owner, an existing share...).
        "move_file": "SELECT f.file_id, t.folder_id FROM files f JOIN folders d ON d.folder_id = f.folder_id "
        "JOIN folders t ON t.owner_id = d.owner_id AND t.folder_id != f.folder_id "
        "WHERE NOT EXISTS (SELECT 1 FROM files o WHERE o.folder_id = t.folder_id AND lower(o.name) = lower(f.name)) "
        "ORDER BY f.file_id, t.folder_id",
        "unshare_file": "SELECT file_id, user_id FROM shares ORDER BY file_id, user_id",
        # A new share with either access, or an existing share switched to the other access.
        "share_file": "SELECT f.file_id, u.user_id, p.column1 AS permission "
        "FROM files f JOIN folders d USING (folder_id) JOIN users u ON u.user_id != d.owner_id "
        "CROSS JOIN (VALUES ('read'), ('write')) p "
        "WHERE NOT EXISTS (SELECT 1 FROM shares s WHERE s.file_id = f.file_id AND s.user_id = u.user_id "
        "AND s.permission = p.column1) ORDER BY f.file_id, u.user_id, permission",
        "create_folder": "SELECT owner_id AS user_id, folder_id AS parent_id FROM folders ORDER BY folder_id",
    }

    @classmethod
    def populate(cls, db: sqlite3.Connection, rng: random.Random) -> None:
        users = []
        for i in range(1, 11):
            first, last = rng.choice(FIRST), rng.choice(LAST)
            uid = f"U{i:04d}"
            users.append(uid)
            db.execute(
                "INSERT INTO users VALUES (?,?,?)",
                (uid, f"{first} {last}", f"{first.lower()}.{last.lower()}{i}@example.com"),
            )
        folders = []  # (folder_id, owner)
        for uid in users:
            root = f"D{len(folders) + 1:04d}"
            db.execute("INSERT INTO folders VALUES (?,?,?,?)", (root, uid, None, "My Drive"))
            folders.append((root, uid))
            for name in rng.sample(SUBFOLDERS, rng.randint(1, 2)):
                fid = f"D{len(folders) + 1:04d}"
                db.execute("INSERT INTO folders VALUES (?,?,?,?)", (fid, uid, root, name))
                folders.append((fid, uid))
        owner_of, names_in = {}, {fid: [] for fid, _ in folders}
        for i in range(1, 36):
            folder, owner = rng.choice(folders)
            name = f"{rng.choice(STEMS)}_{rng.randint(1, 9)}.{rng.choice(EXTENSIONS)}"
            while name in names_in[folder]:
                name = f"{rng.choice(STEMS)}_{rng.randint(1, 9)}.{rng.choice(EXTENSIONS)}"
            names_in[folder].append(name)
            fid = f"F{i:04d}"
            owner_of[fid] = owner
            db.execute(
                "INSERT INTO files VALUES (?,?,?,?,?)",
                (fid, folder, name, rng.randint(4, 4000), f"2025-{rng.randint(6, 12):02d}-{rng.randint(1, 28):02d}"),
            )
        shared = []
        while len(shared) < 20:
            fid = rng.choice(list(owner_of))
            uid = rng.choice(users)
            if uid == owner_of[fid] or (fid, uid) in shared:
                continue
            shared.append((fid, uid))
            db.execute("INSERT INTO shares VALUES (?,?,?)", (fid, uid, rng.choice(("read", "read", "write"))))

    # helpers ------------------------------------------------------------------------------------------
    def _user(self, user_id: str) -> User:
        return self.one("SELECT * FROM users WHERE user_id = ?", user_id, missing="User not found")

    def _folder(self, folder_id: str) -> Folder:
        return self.one("SELECT * FROM folders WHERE folder_id = ?", folder_id, missing="Folder not found")

    def _name_taken(self, folder_id: str, name: str) -> bool:
        return self.db.execute(
            "SELECT 1 FROM files WHERE folder_id = ? AND lower(name) = lower(?)", (folder_id, name)
        ).fetchone() is not None

    # reads --------------------------------------------------------------------------------------------
    @tool(mutates=False, phrase="look up the drive user with email {email}", answer="user_id")
    def find_user_by_email(self, email: str) -> User:
        """Find a user by their email address.

        Args:
            email: The user's email, e.g. "aiko.bakker1@example.com".
        """
        return self.one("SELECT * FROM users WHERE lower(email) = lower(?)", email, missing="User not found")

    @tool(mutates=False, phrase="list the folders of user {user_id}", answer="#")
    def list_folders(self, user_id: str) -> list[Folder]:
        """List all folders a user owns, with their parent folders.

        Args:
            user_id: The user id, e.g. "U0001".
        """
        self._user(user_id)
        return self.all("SELECT * FROM folders WHERE owner_id = ? ORDER BY folder_id", user_id)

    @tool(mutates=False, phrase="list the files in folder {folder_id}", answer="#")
    def list_folder(self, folder_id: str) -> list[FileInfo]:
        """List the files directly inside a folder, by name.

        Args:
            folder_id: The folder id, e.g. "D0001".
        """
        self._folder(folder_id)
        return self.all("SELECT * FROM files WHERE folder_id = ? ORDER BY name, file_id", folder_id)

    @tool(mutates=False, phrase="get the details of file {file_id}", answer="size_kb")
    def get_file(self, file_id: str) -> FileDetail:
        """Get a file's folder, owner, size and who it is shared with.

        Args:
            file_id: The file id, e.g. "F0001".
        """
        detail = self.one(
            "SELECT f.*, d.owner_id FROM files f JOIN folders d USING (folder_id) WHERE f.file_id = ?",
            file_id, missing="File not found",
        )
        detail["shared_with"] = self.all(
            "SELECT user_id, permission FROM shares WHERE file_id = ? ORDER BY user_id", file_id
        )
        detail["share_count"] = len(detail["shared_with"])
        return detail

    @tool(mutates=False, phrase="find the files of user {user_id} with '{name_contains}' in the name", answer="#")
    def search_files(self, user_id: str, name_contains: str, extension: str | None = None) -> list[FileInfo]:
        """Search a user's own files by part of the name, optionally by extension.

        Args:
            user_id: The owner's user id, e.g. "U0001".
            name_contains: Text the file name contains (case-insensitive), e.g. "budget".
            extension: Only files with this extension, without the dot, e.g. "pdf".
        """
        self._user(user_id)
        if not name_contains.strip():
            raise ToolError("Give some text to search for")
        files = self.all(
            "SELECT f.* FROM files f JOIN folders d USING (folder_id) WHERE d.owner_id = ? "
            "AND instr(lower(f.name), lower(?)) > 0 ORDER BY f.name, f.file_id",
            user_id, name_contains.strip(),
        )
        if extension is not None:
            suffix = "." + extension.lower().lstrip(".")
            files = [f for f in files if f["name"].lower().endswith(suffix)]
        return files

    @tool(mutates=False, phrase="how much storage is user {user_id} using", answer="total_kb")
    def get_storage_usage(self, user_id: str) -> Usage:
        """Get how many files a user owns and how much space they take.

        Args:
            user_id: The user id, e.g. "U0001".
        """
        self._user(user_id)
        count, total = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(f.size_kb), 0) FROM files f JOIN folders d USING (folder_id) "
            "WHERE d.owner_id = ?", (user_id,),
        ).fetchone()
        return {"user_id": user_id, "file_count": count, "total_kb": total, "quota_kb": QUOTA_KB,
                "free_kb": QUOTA_KB - total}

    # writes -------------------------------------------------------------------------------------------
    @tool(mutates=True, phrase="create a folder '{name}' for user {user_id}", answer="folder_id")
    def create_folder(self, user_id: str, name: str, parent_id: str | None = None) -> Folder:
        """Create a folder, at the top level or inside another folder of the same user.

        Args:
            user_id: The owner's user id, e.g. "U0001".
            name: The folder name, e.g. "Archive".
            parent_id: The folder to create it in, e.g. "D0001"; top level if omitted.
        """
        self._user(user_id)
        name = name.strip()
        if not name or "/" in name:
            raise ToolError("Folder names must be non-empty and contain no '/'")
        if parent_id is not None and self._folder(parent_id)["owner_id"] != user_id:
            raise ToolError(f"Folder {parent_id} belongs to another user")
        if self.db.execute(
            "SELECT 1 FROM folders WHERE owner_id = ? AND parent_id IS ? AND lower(name) = lower(?)",
            (user_id, parent_id, name),
        ).fetchone():
            raise ToolError(f"A folder named {name!r} already exists there")
        fid = self.next_id("folders", "folder_id", "D")
        self.db.execute("INSERT INTO folders VALUES (?,?,?,?)", (fid, user_id, parent_id, name))
        return self._folder(fid)

    @tool(mutates=True, phrase="move file {file_id} into folder {folder_id}", answer="folder_id")
    def move_file(self, file_id: str, folder_id: str) -> FileDetail:
        """Move a file into another folder of the same owner.

        Args:
            file_id: The file id, e.g. "F0001".
            folder_id: The destination folder id, e.g. "D0002".
        """
        file = self.get_file(file_id)
        target = self._folder(folder_id)
        if file["folder_id"] == folder_id:
            raise ToolError(f"File {file_id} is already in folder {folder_id}")
        if target["owner_id"] != file["owner_id"]:
            raise ToolError(f"Folder {folder_id} belongs to another user")
        if self._name_taken(folder_id, file["name"]):
            raise ToolError(f"Folder {folder_id} already has a file named {file['name']!r}")
        self.db.execute("UPDATE files SET folder_id = ? WHERE file_id = ?", (folder_id, file_id))
        return self.get_file(file_id)

    @tool(mutates=True, phrase="rename file {file_id} to {new_name}", answer="name")
    def rename_file(self, file_id: str, new_name: str) -> FileDetail:
        """Rename a file, keeping it in its folder.

        Args:
            file_id: The file id, e.g. "F0001".
            new_name: The new file name with its extension, e.g. "budget_2026.xlsx".
        """
        file = self.get_file(file_id)
        new_name = new_name.strip()
        if not new_name or "/" in new_name:
            raise ToolError("File names must be non-empty and contain no '/'")
        if new_name == file["name"]:
            raise ToolError(f"File {file_id} is already named {new_name!r}")
        if new_name.lower() != file["name"].lower() and self._name_taken(file["folder_id"], new_name):
            raise ToolError(f"Folder {file['folder_id']} already has a file named {new_name!r}")
        self.db.execute("UPDATE files SET name = ? WHERE file_id = ?", (new_name, file_id))
        return self.get_file(file_id)

    @tool(mutates=True, phrase="delete file {file_id}", answer="shares_removed")
    def delete_file(self, file_id: str) -> Deleted:
        """Delete a file permanently; it stops being shared with anyone.

        Args:
            file_id: The file id, e.g. "F0001".
        """
        file = self.get_file(file_id)
        self.db.execute("DELETE FROM shares WHERE file_id = ?", (file_id,))
        self.db.execute("DELETE FROM files WHERE file_id = ?", (file_id,))
        return {"file_id": file_id, "name": file["name"], "status": "deleted", "shares_removed": file["share_count"]}

    @tool(mutates=True, phrase="share file {file_id} with user {user_id} ({permission} access)", answer="permission")
    def share_file(self, file_id: str, user_id: str, permission: Literal["read", "write"]) -> Share:
        """Share a file with another user, or change the access of an existing share.

        Args:
            file_id: The file id, e.g. "F0001".
            user_id: The user to share with, e.g. "U0002".
            permission: Whether they may only read the file or also edit it.
        """
        file = self.get_file(file_id)
        self._user(user_id)
        if user_id == file["owner_id"]:
            raise ToolError(f"User {user_id} owns file {file_id}")
        current = next((s for s in file["shared_with"] if s["user_id"] == user_id), None)
        if current is not None and current["permission"] == permission:
            raise ToolError(f"File {file_id} is already shared with {user_id} with {permission} access")
        self.db.execute(
            "INSERT INTO shares VALUES (?,?,?) "
            "ON CONFLICT (file_id, user_id) DO UPDATE SET permission = excluded.permission",
            (file_id, user_id, permission),
        )
        return {"file_id": file_id, "user_id": user_id, "permission": permission}

    @tool(mutates=True, phrase="stop sharing file {file_id} with user {user_id}", answer="share_count")
    def unshare_file(self, file_id: str, user_id: str) -> FileDetail:
        """Stop sharing a file with a user.

        Args:
            file_id: The file id, e.g. "F0001".
            user_id: The user to remove access from, e.g. "U0002".
        """
        file = self.get_file(file_id)
        if not any(s["user_id"] == user_id for s in file["shared_with"]):
            raise ToolError(f"File {file_id} is not shared with user {user_id}")
        self.db.execute("DELETE FROM shares WHERE file_id = ? AND user_id = ?", (file_id, user_id))
        return self.get_file(file_id)
