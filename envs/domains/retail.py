"""Retail: customers, a product catalogue, orders with line items, and returns."""

from __future__ import annotations

import random
import sqlite3
from typing import Literal, TypedDict

from envs.base import Domain, ToolError, tool

CATEGORIES = ("kitchen", "garden", "electronics", "books", "toys")
CITIES = ("Lisbon", "Oslo", "Austin", "Osaka", "Nairobi", "Lima", "Perth", "Ghent")
FIRST = ("Ana", "Ben", "Chloe", "Dev", "Eva", "Farid", "Gita", "Hugo", "Iris", "Jon", "Kemi", "Luca", "Mei", "Noor")
LAST = ("Silva", "Berg", "Moreau", "Patel", "Okafor", "Tanaka", "Novak", "Reyes", "Olsen", "Kaur")
ADJ = ("Blue", "Compact", "Classic", "Smart", "Rustic", "Mini", "Deluxe", "Solar", "Quiet", "Bright")
NOUN = {
    "kitchen": ("Kettle", "Mug", "Pan", "Grinder"),
    "garden": ("Hose", "Shovel", "Planter", "Lantern"),
    "electronics": ("Speaker", "Charger", "Headset", "Router"),
    "books": ("Atlas", "Cookbook", "Novel", "Guide"),
    "toys": ("Kite", "Puzzle", "Robot", "Yo-yo"),
}


class Customer(TypedDict):
    customer_id: str
    name: str
    email: str
    city: str
    tier: str


class Product(TypedDict):
    product_id: str
    name: str
    category: str
    price: float
    stock: int


class OrderSummary(TypedDict):
    order_id: str
    status: str
    total: float
    created: str


class Item(TypedDict):
    product_id: str
    quantity: int
    price: float


class Order(TypedDict):
    order_id: str
    customer_id: str
    status: str
    total: float
    created: str
    items: list[Item]


class Return(TypedDict):
    return_id: str
    order_id: str
    product_id: str
    refund: float
    status: str


class Retail(Domain):
    name = "retail"
    description = "An online shop: customers, products, orders and returns."
    schema_sql = """
    CREATE TABLE customers (customer_id TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT UNIQUE NOT NULL,
                            city TEXT NOT NULL, tier TEXT NOT NULL);
    CREATE TABLE products (product_id TEXT PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL,
                           price REAL NOT NULL, stock INTEGER NOT NULL);
    CREATE TABLE orders (order_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL REFERENCES customers,
                         status TEXT NOT NULL, total REAL NOT NULL, created TEXT NOT NULL,
                         cancel_reason TEXT);
    CREATE TABLE order_items (order_id TEXT NOT NULL REFERENCES orders, product_id TEXT NOT NULL REFERENCES products,
                              quantity INTEGER NOT NULL, price REAL NOT NULL, PRIMARY KEY (order_id, product_id));
    CREATE TABLE returns (return_id TEXT PRIMARY KEY, order_id TEXT NOT NULL REFERENCES orders,
                          product_id TEXT NOT NULL REFERENCES products, reason TEXT NOT NULL,
                          refund REAL NOT NULL, status TEXT NOT NULL);
    """
    arg_sources = {
        "email": "SELECT email FROM customers",
        "customer_id": "SELECT customer_id FROM customers",
        "order_id": "SELECT order_id FROM orders",
        "product_id": "SELECT product_id FROM products",
        "city": "SELECT DISTINCT city FROM customers",
        "cancel_order.order_id": "SELECT order_id FROM orders WHERE status IN ('pending', 'processing')",
        "return_item.order_id": "SELECT order_id FROM orders WHERE status = 'delivered'",
        "place_order.product_id": "SELECT product_id FROM products WHERE stock >= 3",
        "return_item": (
            "SELECT i.order_id, i.product_id FROM order_items i JOIN orders o USING (order_id) "
            "WHERE o.status = 'delivered' AND NOT EXISTS "
            "(SELECT 1 FROM returns r WHERE r.order_id = i.order_id AND r.product_id = i.product_id)"
        ),
    }

    @classmethod
    def populate(cls, db: sqlite3.Connection, rng: random.Random) -> None:
        customers = []
        for i in range(1, 16):
            first, last = rng.choice(FIRST), rng.choice(LAST)
            cid = f"C{i:04d}"
            customers.append(cid)
            db.execute(
                "INSERT INTO customers VALUES (?,?,?,?,?)",
                (cid, f"{first} {last}", f"{first.lower()}.{last.lower()}{i}@example.com", rng.choice(CITIES),
                 rng.choice(("standard", "gold"))),
            )
        products = []
        for i in range(1, 21):
            cat = CATEGORIES[i % len(CATEGORIES)]
            pid = f"P{i:04d}"
            products.append(pid)
            db.execute(
                "INSERT INTO products VALUES (?,?,?,?,?)",
                (pid, f"{rng.choice(ADJ)} {rng.choice(NOUN[cat])}", cat, round(rng.uniform(5, 120), 2),
                 rng.randint(0, 25)),
            )
        prices = dict(db.execute("SELECT product_id, price FROM products").fetchall())
        for i in range(1, 41):
            oid = f"O{i:04d}"
            status = rng.choice(("pending", "processing", "shipped", "delivered", "delivered", "cancelled"))
            items = rng.sample(products, rng.randint(1, 3))
            lines = [(pid, rng.randint(1, 3)) for pid in items]
            total = round(sum(prices[p] * q for p, q in lines), 2)
            db.execute(
                "INSERT INTO orders VALUES (?,?,?,?,?,?)",
                (oid, rng.choice(customers), status, total, f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                 "no longer needed" if status == "cancelled" else None),
            )
            db.executemany(
                "INSERT INTO order_items VALUES (?,?,?,?)", [(oid, p, q, prices[p]) for p, q in lines]
            )

    # reads --------------------------------------------------------------------------------------------
    @tool(mutates=False, phrase="look up the customer account with email {email}", answer="customer_id")
    def find_customer_by_email(self, email: str) -> Customer:
        """Find a customer by their email address.

        Args:
            email: The customer's email, e.g. "ana.silva1@example.com".
        """
        return self.one("SELECT * FROM customers WHERE lower(email) = lower(?)", email, missing="Customer not found")

    @tool(mutates=False, phrase="get the details of customer {customer_id}", answer="city")
    def get_customer(self, customer_id: str) -> Customer:
        """Get a customer's profile.

        Args:
            customer_id: The customer id, e.g. "C0001".
        """
        return self.one("SELECT * FROM customers WHERE customer_id = ?", customer_id, missing="Customer not found")

    @tool(mutates=False, phrase="list the orders of customer {customer_id}", answer="#")
    def list_orders(self, customer_id: str) -> list[OrderSummary]:
        """List a customer's orders, oldest first.

        Args:
            customer_id: The customer id, e.g. "C0001".
        """
        self.one("SELECT 1 FROM customers WHERE customer_id = ?", customer_id, missing="Customer not found")
        return self.all(
            "SELECT order_id, status, total, created FROM orders WHERE customer_id = ? ORDER BY created, order_id",
            customer_id,
        )

    @tool(mutates=False, phrase="get the details of order {order_id}", answer="total")
    def get_order(self, order_id: str) -> Order:
        """Get an order with its line items.

        Args:
            order_id: The order id, e.g. "O0001".
        """
        order = self.one(
            "SELECT order_id, customer_id, status, total, created FROM orders WHERE order_id = ?", order_id,
            missing="Order not found",
        )
        order["items"] = self.all(
            "SELECT product_id, quantity, price FROM order_items WHERE order_id = ? ORDER BY product_id", order_id
        )
        return order

    @tool(mutates=False, phrase="find the {category} products under {max_price}", answer="#")
    def search_products(self, category: Literal[CATEGORIES], max_price: float = 1000.0) -> list[Product]:
        """Search the catalogue by category, cheapest first.

        Args:
            category: Product category, e.g. "kitchen".
            max_price: Highest unit price to include, e.g. 50.0.
        """
        return self.all(
            "SELECT * FROM products WHERE category = ? AND price <= ? ORDER BY price, product_id", category, max_price
        )

    @tool(mutates=False, phrase="check product {product_id}", answer="stock")
    def get_product(self, product_id: str) -> Product:
        """Get a product's price and stock level.

        Args:
            product_id: The product id, e.g. "P0001".
        """
        return self.one("SELECT * FROM products WHERE product_id = ?", product_id, missing="Product not found")

    # writes -------------------------------------------------------------------------------------------
    @tool(mutates=True, phrase="cancel order {order_id} (reason: {reason})", answer="status")
    def cancel_order(self, order_id: str, reason: Literal["no longer needed", "ordered by mistake"]) -> Order:
        """Cancel an order that has not shipped yet and restock its items.

        Args:
            order_id: The order id, e.g. "O0001".
            reason: Why the customer cancels.
        """
        order = self.get_order(order_id)
        if order["status"] not in ("pending", "processing"):
            raise ToolError(f"Order {order_id} is {order['status']} and can no longer be cancelled")
        for item in order["items"]:
            self.db.execute(
                "UPDATE products SET stock = stock + ? WHERE product_id = ?", (item["quantity"], item["product_id"])
            )
        self.db.execute(
            "UPDATE orders SET status = 'cancelled', cancel_reason = ? WHERE order_id = ?", (reason, order_id)
        )
        return self.get_order(order_id)

    @tool(mutates=True, phrase="order {quantity} of product {product_id} for customer {customer_id}", answer="total")
    def place_order(self, customer_id: str, product_id: str, quantity: int) -> Order:
        """Place a new order for one product.

        Args:
            customer_id: The customer id, e.g. "C0001".
            product_id: The product id, e.g. "P0001".
            quantity: How many units, 1 to 10.
        """
        if not 1 <= quantity <= 10:
            raise ToolError("Quantity must be between 1 and 10")
        self.one("SELECT 1 FROM customers WHERE customer_id = ?", customer_id, missing="Customer not found")
        product = self.get_product(product_id)
        if product["stock"] < quantity:
            raise ToolError(f"Only {product['stock']} units of {product_id} in stock")
        oid = self.next_id("orders", "order_id", "O")
        total = round(product["price"] * quantity, 2)
        self.db.execute(
            "INSERT INTO orders VALUES (?,?,?,?,?,?)", (oid, customer_id, "pending", total, self.today, None)
        )
        self.db.execute("INSERT INTO order_items VALUES (?,?,?,?)", (oid, product_id, quantity, product["price"]))
        self.db.execute("UPDATE products SET stock = stock - ? WHERE product_id = ?", (quantity, product_id))
        return self.get_order(oid)

    @tool(mutates=True, phrase="move customer {customer_id} to {city}", answer="city")
    def update_customer_city(self, customer_id: str, city: str) -> Customer:
        """Change the city on a customer's profile.

        Args:
            customer_id: The customer id, e.g. "C0001".
            city: The new city, e.g. "Oslo".
        """
        customer = self.get_customer(customer_id)
        if customer["city"] == city:
            raise ToolError(f"Customer {customer_id} already lives in {city}")
        self.db.execute("UPDATE customers SET city = ? WHERE customer_id = ?", (city, customer_id))
        return self.get_customer(customer_id)

    @tool(mutates=True, phrase="return product {product_id} from order {order_id} ({reason})", answer="refund")
    def return_item(
        self, order_id: str, product_id: str, reason: Literal["damaged", "wrong size", "changed mind"]
    ) -> Return:
        """Return one product of a delivered order for a refund.

        Args:
            order_id: The order id, e.g. "O0001".
            product_id: The product to return, e.g. "P0001".
            reason: Why it is returned.
        """
        order = self.get_order(order_id)
        if order["status"] != "delivered":
            raise ToolError(f"Order {order_id} is {order['status']}; only delivered orders can be returned")
        item = next((i for i in order["items"] if i["product_id"] == product_id), None)
        if item is None:
            raise ToolError(f"Product {product_id} is not in order {order_id}")
        if self.db.execute(
            "SELECT 1 FROM returns WHERE order_id = ? AND product_id = ?", (order_id, product_id)
        ).fetchone():
            raise ToolError("This item was already returned")
        rid = self.next_id("returns", "return_id", "R")
        refund = round(item["price"] * item["quantity"], 2)
        self.db.execute(
            "INSERT INTO returns VALUES (?,?,?,?,?,?)", (rid, order_id, product_id, reason, refund, "approved")
        )
        return self.one("SELECT return_id, order_id, product_id, refund, status FROM returns WHERE return_id = ?",
                        rid, missing="Return not found")

    @tool(mutates=True, phrase="add {quantity} units of product {product_id} to stock", answer="stock")
    def restock_product(self, product_id: str, quantity: int) -> Product:
        """Add units to a product's stock.

        Args:
            product_id: The product id, e.g. "P0001".
            quantity: Units to add, 1 to 100.
        """
        if not 1 <= quantity <= 100:
            raise ToolError("Quantity must be between 1 and 100")
        self.get_product(product_id)
        self.db.execute("UPDATE products SET stock = stock + ? WHERE product_id = ?", (quantity, product_id))
        return self.get_product(product_id)
