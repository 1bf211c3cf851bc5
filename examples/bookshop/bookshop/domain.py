"""Bookshop: authors, their books, and customers' orders of them."""

from __future__ import annotations

import random
import sqlite3
from typing import Literal, TypedDict

from envs.base import Domain, ToolError, tool

GENRES = ("fiction", "history", "science", "poetry", "travel")
FIRST = ("Ada", "Bruno", "Clara", "Dmitri", "Elif", "Femi", "Grete", "Hiro", "Ines", "Jonas", "Kaveh", "Lena")
LAST = ("Achebe", "Bauer", "Castro", "Dahl", "Eriksen", "Fujita", "Gomez", "Haddad", "Ivanova", "Jansen")
COUNTRIES = ("Nigeria", "Austria", "Chile", "Norway", "Japan", "Spain", "Lebanon", "Netherlands")
TITLE_A = ("Silent", "Northern", "Last", "Hidden", "Golden", "Small", "Distant", "Paper")
TITLE_B = ("River", "Atlas", "Garden", "Empire", "Theorem", "Harbour", "Letters", "Season")
CUSTOMERS = ("ana@example.com", "ben@example.com", "chen@example.com", "dara@example.com", "eli@example.com")


class Book(TypedDict):
    book_id: str
    title: str
    author_id: str
    genre: str
    price: float
    stock: int


class Order(TypedDict):
    order_id: str
    book_id: str
    customer: str
    quantity: int
    total: float
    status: str


class Bookshop(Domain):
    name = "bookshop"
    description = "A bookshop: authors, their books with prices and stock, and customers' orders."
    schema_sql = """
    CREATE TABLE authors (author_id TEXT PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL);
    CREATE TABLE books (book_id TEXT PRIMARY KEY, title TEXT NOT NULL, author_id TEXT NOT NULL REFERENCES authors,
                        genre TEXT NOT NULL, price REAL NOT NULL, stock INTEGER NOT NULL);
    CREATE TABLE orders (order_id TEXT PRIMARY KEY, book_id TEXT NOT NULL REFERENCES books, customer TEXT NOT NULL,
                         quantity INTEGER NOT NULL, total REAL NOT NULL, status TEXT NOT NULL, placed TEXT NOT NULL);
    """
    arg_sources = {
        "author_id": "SELECT author_id FROM authors",
        "book_id": "SELECT book_id FROM books",
        "order_id": "SELECT order_id FROM orders",
        "customer": "SELECT DISTINCT customer FROM orders",
        "order_book.book_id": "SELECT book_id FROM books WHERE stock >= 3",
        "cancel_order.order_id": "SELECT order_id FROM orders WHERE status = 'open'",
    }

    @classmethod
    def populate(cls, db: sqlite3.Connection, rng: random.Random) -> None:
        authors = []
        for i in range(1, 9):
            aid = f"A{i:04d}"
            authors.append(aid)
            db.execute("INSERT INTO authors VALUES (?,?,?)",
                       (aid, f"{rng.choice(FIRST)} {rng.choice(LAST)}", rng.choice(COUNTRIES)))
        books = []
        for i in range(1, 25):
            bid = f"B{i:04d}"
            books.append(bid)
            db.execute("INSERT INTO books VALUES (?,?,?,?,?,?)",
                       (bid, f"The {rng.choice(TITLE_A)} {rng.choice(TITLE_B)}", rng.choice(authors),
                        GENRES[i % len(GENRES)], round(rng.uniform(6, 45), 2), rng.randint(0, 12)))
        prices = dict(db.execute("SELECT book_id, price FROM books").fetchall())
        for i in range(1, 21):
            bid, quantity = rng.choice(books), rng.randint(1, 3)
            db.execute("INSERT INTO orders VALUES (?,?,?,?,?,?,?)",
                       (f"O{i:04d}", bid, rng.choice(CUSTOMERS), quantity, round(prices[bid] * quantity, 2),
                        rng.choice(("open", "open", "shipped", "cancelled")),
                        f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"))

    # reads --------------------------------------------------------------------------------------------
    @tool(mutates=False, phrase="list the books by author {author_id}", answer="#")
    def list_books_by_author(self, author_id: str) -> list[Book]:
        """List an author's books, by title.

        Args:
            author_id: The author id, e.g. "A0001".
        """
        self.one("SELECT 1 FROM authors WHERE author_id = ?", author_id, missing="Author not found")
        return self.all("SELECT * FROM books WHERE author_id = ? ORDER BY title, book_id", author_id)

    @tool(mutates=False, phrase="find the {genre} books under {max_price}", answer="#")
    def search_books(self, genre: Literal[GENRES], max_price: float = 100.0) -> list[Book]:
        """Search the shelves by genre, cheapest first.

        Args:
            genre: The genre, e.g. "history".
            max_price: Highest price to include, e.g. 20.0.
        """
        return self.all("SELECT * FROM books WHERE genre = ? AND price <= ? ORDER BY price, book_id", genre, max_price)

    @tool(mutates=False, phrase="check book {book_id}", answer="stock")
    def get_book(self, book_id: str) -> Book:
        """Get a book's price and stock.

        Args:
            book_id: The book id, e.g. "B0001".
        """
        return self.one("SELECT * FROM books WHERE book_id = ?", book_id, missing="Book not found")

    @tool(mutates=False, phrase="get order {order_id}", answer="status")
    def get_order(self, order_id: str) -> Order:
        """Get an order and its status.

        Args:
            order_id: The order id, e.g. "O0001".
        """
        return self.one("SELECT order_id, book_id, customer, quantity, total, status FROM orders WHERE order_id = ?",
                        order_id, missing="Order not found")

    # writes -------------------------------------------------------------------------------------------
    @tool(mutates=True, phrase="order {quantity} copies of book {book_id} for {customer}", answer="total")
    def order_book(self, book_id: str, customer: str, quantity: int) -> Order:
        """Order copies of a book for a customer.

        Args:
            book_id: The book id, e.g. "B0001".
            customer: The customer's email, e.g. "ana@example.com".
            quantity: How many copies, 1 to 5.
        """
        if not 1 <= quantity <= 5:
            raise ToolError("Quantity must be between 1 and 5")
        book = self.get_book(book_id)
        if book["stock"] < quantity:
            raise ToolError(f"Only {book['stock']} copies of {book_id} in stock")
        oid = self.next_id("orders", "order_id", "O")
        self.db.execute("INSERT INTO orders VALUES (?,?,?,?,?,?,?)",
                        (oid, book_id, customer, quantity, round(book["price"] * quantity, 2), "open", self.today))
        self.db.execute("UPDATE books SET stock = stock - ? WHERE book_id = ?", (quantity, book_id))
        return self.get_order(oid)

    @tool(mutates=True, phrase="cancel order {order_id}", answer="status")
    def cancel_order(self, order_id: str) -> Order:
        """Cancel an open order and put its copies back on the shelf.

        Args:
            order_id: The order id, e.g. "O0001".
        """
        order = self.get_order(order_id)
        if order["status"] != "open":
            raise ToolError(f"Order {order_id} is {order['status']} and can no longer be cancelled")
        self.db.execute("UPDATE books SET stock = stock + ? WHERE book_id = ?", (order["quantity"], order["book_id"]))
        self.db.execute("UPDATE orders SET status = 'cancelled' WHERE order_id = ?", (order_id,))
        return self.get_order(order_id)

    @tool(mutates=True, phrase="set the price of book {book_id} to {price}", answer="price")
    def set_price(self, book_id: str, price: float) -> Book:
        """Change a book's price.

        Args:
            book_id: The book id, e.g. "B0001".
            price: The new price, 1.0 to 200.0.
        """
        if not 1.0 <= price <= 200.0:
            raise ToolError("Price must be between 1.0 and 200.0")
        book = self.get_book(book_id)
        if book["price"] == price:
            raise ToolError(f"Book {book_id} already costs {price}")
        self.db.execute("UPDATE books SET price = ? WHERE book_id = ?", (price, book_id))
        return self.get_book(book_id)
