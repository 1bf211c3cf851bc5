"""Banking: customers, their checking and savings accounts, transactions, payees and payment cards."""

from __future__ import annotations

import random
import re
import sqlite3
from typing import Literal, TypedDict

from envs.base import Domain, ToolError, tool

FIRST = ("Amir", "Beatriz", "Chen", "Dana", "Emeka", "Freya", "Goran", "Hana", "Ivan", "Julia", "Kofi", "Lena")
LAST = ("Almeida", "Brandt", "Castillo", "Dlamini", "Evans", "Fontaine", "Gupta", "Holm", "Ibrahim", "Kowalski")
CITIES = ("Porto", "Bergen", "Denver", "Kyoto", "Accra", "Quito", "Hobart", "Leuven")
PAYEES = ("Greenleaf Energy", "City Water", "Northwind Telecom", "Maple Lettings", "Sunrise Gym", "Harbor Insurance",
          "Riverside School", "Pine Dental")
NEW_IBANS = ("GB33BUKB20201555555555", "DE89370400440532013000", "FR1420041010050500013M02606",
             "NL91ABNA0417164300", "ES9121000418450200051332", "IT60X0542811101000000123456")
SPENDING = ("Grocery store", "Coffee shop", "Online bookshop", "Train tickets", "Pharmacy", "Restaurant")
INCOME = ("Salary", "Refund", "Interest")
MIN_TRANSFER_BALANCE = 100


def _values(values: tuple) -> str:
    """SQL listing fixed values, for parameters whose valid values do not come from the state."""
    return "SELECT column1 FROM (VALUES " + ", ".join(f"({v!r})" for v in values) + ")"


class Customer(TypedDict):
    customer_id: str
    name: str
    email: str
    city: str


class Account(TypedDict):
    account_id: str
    customer_id: str
    type: str
    balance: float


class Transaction(TypedDict):
    transaction_id: str
    account_id: str
    date: str
    amount: float
    description: str


class Transfer(TypedDict):
    transaction_id: str
    from_account_id: str
    to_account_id: str
    amount: float
    balance: float
    to_balance: float


class Payee(TypedDict):
    payee_id: str
    customer_id: str
    name: str
    iban: str


class Payment(TypedDict):
    transaction_id: str
    account_id: str
    payee_id: str
    amount: float
    balance: float


class Card(TypedDict):
    card_id: str
    account_id: str
    last4: str
    status: str
    daily_limit: float


class Banking(Domain):
    name = "banking"
    description = "A retail bank: customers, checking and savings accounts, transfers, payees and cards."
    schema_sql = """
    CREATE TABLE customers (customer_id TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT UNIQUE NOT NULL,
                            city TEXT NOT NULL);
    CREATE TABLE accounts (account_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL REFERENCES customers,
                           type TEXT NOT NULL CHECK (type IN ('checking', 'savings')), balance REAL NOT NULL);
    CREATE TABLE transactions (transaction_id TEXT PRIMARY KEY, account_id TEXT NOT NULL REFERENCES accounts,
                               date TEXT NOT NULL, amount REAL NOT NULL, description TEXT NOT NULL);
    CREATE TABLE payees (payee_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL REFERENCES customers,
                         name TEXT NOT NULL, iban TEXT NOT NULL, UNIQUE (customer_id, iban));
    CREATE TABLE cards (card_id TEXT PRIMARY KEY, account_id TEXT NOT NULL REFERENCES accounts,
                        last4 TEXT NOT NULL, status TEXT NOT NULL CHECK (status IN ('active', 'frozen')),
                        daily_limit REAL NOT NULL);
    """
    arg_sources = {
        "email": "SELECT email FROM customers",
        "customer_id": "SELECT customer_id FROM customers",
        "account_id": "SELECT account_id FROM accounts",
        "from_account_id": "SELECT account_id FROM accounts",
        "to_account_id": "SELECT account_id FROM accounts",
        "payee_id": "SELECT payee_id FROM payees",
        "card_id": "SELECT card_id FROM cards",
        "name": _values(PAYEES),
        "iban": _values(NEW_IBANS),
        "list_cards.account_id": "SELECT DISTINCT account_id FROM cards",
        "transfer_funds.from_account_id": f"SELECT account_id FROM accounts WHERE balance >= {MIN_TRANSFER_BALANCE}",
        "pay_payee.account_id": "SELECT account_id FROM accounts a WHERE type = 'checking' "
        f"AND balance >= {MIN_TRANSFER_BALANCE} "
        "AND EXISTS (SELECT 1 FROM payees p WHERE p.customer_id = a.customer_id)",
        "freeze_card.card_id": "SELECT card_id FROM cards WHERE status = 'active'",
        "unfreeze_card.card_id": "SELECT card_id FROM cards WHERE status = 'frozen'",
        # Row source: a payee of the account's owner, from a checking account with money on it.
        "pay_payee": "SELECT a.account_id, p.payee_id FROM accounts a JOIN payees p USING (customer_id) "
        f"WHERE a.type = 'checking' AND a.balance >= {MIN_TRANSFER_BALANCE} ORDER BY a.account_id, p.payee_id",
    }

    @classmethod
    def populate(cls, db: sqlite3.Connection, rng: random.Random) -> None:
        customers = []
        for i in range(1, 13):
            first, last = rng.choice(FIRST), rng.choice(LAST)
            cid = f"C{i:04d}"
            customers.append(cid)
            db.execute(
                "INSERT INTO customers VALUES (?,?,?,?)",
                (cid, f"{first} {last}", f"{first.lower()}.{last.lower()}{i}@example.com", rng.choice(CITIES)),
            )
        checking, n_accounts = [], 0
        for cid in customers:
            kinds = ["checking"] + (["savings"] if cid == customers[0] or rng.random() < 0.5 else [])
            for kind in kinds:
                n_accounts += 1
                aid = f"A{n_accounts:04d}"
                balance = rng.uniform(20, 3000) if kind == "checking" else rng.uniform(100, 15000)
                db.execute("INSERT INTO accounts VALUES (?,?,?,?)", (aid, cid, kind, round(balance, 2)))
                if kind == "checking":
                    checking.append(aid)
        accounts = [r[0] for r in db.execute("SELECT account_id FROM accounts ORDER BY account_id")]
        n_tx = 0
        for aid in accounts:
            for _ in range(rng.randint(1, 2)):
                n_tx += 1
                if rng.random() < 0.3:
                    amount, text = round(rng.uniform(50, 2500), 2), rng.choice(INCOME)
                else:
                    amount, text = -round(rng.uniform(3, 180), 2), rng.choice(SPENDING)
                db.execute(
                    "INSERT INTO transactions VALUES (?,?,?,?,?)",
                    (f"T{n_tx:04d}", aid, f"2026-01-{rng.randint(1, 14):02d}", amount, text),
                )
        n_payees = 0
        for cid in customers:
            for name in rng.sample(PAYEES, rng.randint(0, 2) if cid != customers[0] else 2):
                n_payees += 1
                iban = f"PT50{rng.randint(10**18, 10**19 - 1)}"
                db.execute("INSERT INTO payees VALUES (?,?,?,?)", (f"P{n_payees:04d}", cid, name, iban))
        n_cards = 0
        for aid in checking:
            for _ in range(1 if rng.random() < 0.7 else 2):
                n_cards += 1
                status = "frozen" if n_cards == 2 or rng.random() < 0.2 else "active"
                db.execute(
                    "INSERT INTO cards VALUES (?,?,?,?,?)",
                    (f"K{n_cards:04d}", aid, f"{rng.randint(0, 9999):04d}", status,
                     float(rng.choice((300, 500, 1000, 2000)))),
                )

    # helpers ------------------------------------------------------------------------------------------
    def _amount(self, amount: float) -> float:
        value = round(amount, 2)
        if value < 0.01:
            raise ToolError("The amount must be at least 0.01")
        if value > 50000:
            raise ToolError("The amount exceeds the 50000.00 limit for a single payment")
        return value

    def _debit(self, account: Account, amount: float) -> None:
        if account["balance"] < amount:
            raise ToolError(f"Insufficient funds: balance is {account['balance']:.2f}")

    def _post(self, account_id: str, amount: float, description: str) -> str:
        """Book a signed amount on an account and record it as a transaction."""
        tid = self.next_id("transactions", "transaction_id", "T")
        balance = self.get_account(account_id)["balance"]
        self.db.execute(
            "UPDATE accounts SET balance = ? WHERE account_id = ?", (round(balance + amount, 2), account_id)
        )
        self.db.execute(
            "INSERT INTO transactions VALUES (?,?,?,?,?)", (tid, account_id, self.today, amount, description)
        )
        return tid

    def _customer(self, customer_id: str) -> Customer:
        return self.one("SELECT * FROM customers WHERE customer_id = ?", customer_id, missing="Customer not found")

    # reads --------------------------------------------------------------------------------------------
    @tool(mutates=False, phrase="look up the bank customer with email {email}", answer="customer_id")
    def find_customer_by_email(self, email: str) -> Customer:
        """Find a customer by their email address.

        Args:
            email: The customer's email, e.g. "amir.brandt1@example.com".
        """
        return self.one("SELECT * FROM customers WHERE lower(email) = lower(?)", email, missing="Customer not found")

    @tool(mutates=False, phrase="list the accounts of customer {customer_id}", answer="#")
    def list_accounts(self, customer_id: str) -> list[Account]:
        """List a customer's accounts with their balances.

        Args:
            customer_id: The customer id, e.g. "C0001".
        """
        self._customer(customer_id)
        return self.all("SELECT * FROM accounts WHERE customer_id = ? ORDER BY account_id", customer_id)

    @tool(mutates=False, phrase="check the balance of account {account_id}", answer="balance")
    def get_account(self, account_id: str) -> Account:
        """Get an account's type and current balance.

        Args:
            account_id: The account id, e.g. "A0001".
        """
        return self.one("SELECT * FROM accounts WHERE account_id = ?", account_id, missing="Account not found")

    @tool(mutates=False, phrase="show the recent transactions of account {account_id}", answer="#")
    def list_transactions(self, account_id: str, limit: int = 10) -> list[Transaction]:
        """List an account's most recent transactions, newest first.

        Args:
            account_id: The account id, e.g. "A0001".
            limit: How many transactions at most, 1 to 50, e.g. 5.
        """
        if not 1 <= limit <= 50:
            raise ToolError("The limit must be between 1 and 50")
        self.get_account(account_id)
        return self.all(
            "SELECT * FROM transactions WHERE account_id = ? ORDER BY date DESC, transaction_id DESC LIMIT ?",
            account_id, limit,
        )

    @tool(mutates=False, phrase="list the saved payees of customer {customer_id}", answer="#")
    def list_payees(self, customer_id: str) -> list[Payee]:
        """List the payees a customer has saved.

        Args:
            customer_id: The customer id, e.g. "C0001".
        """
        self._customer(customer_id)
        return self.all("SELECT * FROM payees WHERE customer_id = ? ORDER BY payee_id", customer_id)

    @tool(mutates=False, phrase="list the cards on account {account_id}", answer="#")
    def list_cards(self, account_id: str) -> list[Card]:
        """List the payment cards linked to an account.

        Args:
            account_id: The account id, e.g. "A0001".
        """
        self.get_account(account_id)
        return self.all("SELECT * FROM cards WHERE account_id = ? ORDER BY card_id", account_id)

    # writes -------------------------------------------------------------------------------------------
    @tool(mutates=True, phrase="transfer {amount} from account {from_account_id} to account {to_account_id}",
          answer="balance")
    def transfer_funds(self, from_account_id: str, to_account_id: str, amount: float) -> Transfer:
        """Move money from one account to another.

        Args:
            from_account_id: The account to debit, e.g. "A0001".
            to_account_id: The account to credit, e.g. "A0002".
            amount: The amount to move, e.g. 50.0.
        """
        if from_account_id == to_account_id:
            raise ToolError("The two accounts must be different")
        value = self._amount(amount)
        source = self.get_account(from_account_id)
        self.get_account(to_account_id)
        self._debit(source, value)
        tid = self._post(from_account_id, -value, f"Transfer to {to_account_id}")
        self._post(to_account_id, value, f"Transfer from {from_account_id}")
        return {
            "transaction_id": tid,
            "from_account_id": from_account_id,
            "to_account_id": to_account_id,
            "amount": value,
            "balance": self.get_account(from_account_id)["balance"],
            "to_balance": self.get_account(to_account_id)["balance"],
        }

    @tool(mutates=True, phrase="save {name} (IBAN {iban}) as a payee of customer {customer_id}", answer="payee_id")
    def add_payee(self, customer_id: str, name: str, iban: str) -> Payee:
        """Save a new payee for a customer.

        Args:
            customer_id: The customer id, e.g. "C0001".
            name: The payee's name, e.g. "City Water".
            iban: The payee's IBAN, e.g. "DE89370400440532013000".
        """
        self._customer(customer_id)
        name, iban = name.strip(), iban.replace(" ", "").upper()
        if not name:
            raise ToolError("The payee name must not be empty")
        if not re.fullmatch(r"[A-Z]{2}\d{2}[A-Z0-9]{10,30}", iban):
            raise ToolError(f"Invalid IBAN {iban!r}")
        if self.db.execute("SELECT 1 FROM payees WHERE customer_id = ? AND iban = ?", (customer_id, iban)).fetchone():
            raise ToolError(f"A payee with IBAN {iban} is already saved")
        pid = self.next_id("payees", "payee_id", "P")
        self.db.execute("INSERT INTO payees VALUES (?,?,?,?)", (pid, customer_id, name, iban))
        return self.one("SELECT * FROM payees WHERE payee_id = ?", pid, missing="Payee not found")

    @tool(mutates=True, phrase="pay {amount} to payee {payee_id} from account {account_id}", answer="balance")
    def pay_payee(self, account_id: str, payee_id: str, amount: float) -> Payment:
        """Pay a saved payee from one of the payee owner's checking accounts.

        Args:
            account_id: The checking account to pay from, e.g. "A0001".
            payee_id: The payee id, e.g. "P0001".
            amount: The amount to pay, e.g. 25.5.
        """
        value = self._amount(amount)
        account = self.get_account(account_id)
        payee = self.one("SELECT * FROM payees WHERE payee_id = ?", payee_id, missing="Payee not found")
        if payee["customer_id"] != account["customer_id"]:
            raise ToolError(f"Payee {payee_id} is not saved for the owner of account {account_id}")
        if account["type"] != "checking":
            raise ToolError("Payments can only be made from a checking account")
        self._debit(account, value)
        tid = self._post(account_id, -value, f"Payment to {payee['name']}")
        return {
            "transaction_id": tid,
            "account_id": account_id,
            "payee_id": payee_id,
            "amount": value,
            "balance": self.get_account(account_id)["balance"],
        }

    def _card(self, card_id: str) -> Card:
        return self.one("SELECT * FROM cards WHERE card_id = ?", card_id, missing="Card not found")

    def _set_status(self, card_id: str, status: Literal["active", "frozen"]) -> Card:
        card = self._card(card_id)
        if card["status"] == status:
            raise ToolError(f"Card {card_id} is already {status}")
        self.db.execute("UPDATE cards SET status = ? WHERE card_id = ?", (status, card_id))
        return self._card(card_id)

    @tool(mutates=True, phrase="freeze card {card_id}", answer="status")
    def freeze_card(self, card_id: str) -> Card:
        """Freeze an active card so that it cannot be used.

        Args:
            card_id: The card id, e.g. "K0001".
        """
        return self._set_status(card_id, "frozen")

    @tool(mutates=True, phrase="unfreeze card {card_id}", answer="status")
    def unfreeze_card(self, card_id: str) -> Card:
        """Reactivate a frozen card.

        Args:
            card_id: The card id, e.g. "K0001".
        """
        return self._set_status(card_id, "active")

    @tool(mutates=True, phrase="set the daily limit of card {card_id} to {daily_limit}", answer="daily_limit")
    def set_card_limit(self, card_id: str, daily_limit: float) -> Card:
        """Change a card's daily spending limit.

        Args:
            card_id: The card id, e.g. "K0001".
            daily_limit: The new daily limit, 1 to 10000, e.g. 80.0.
        """
        value = round(daily_limit, 2)
        if not 1 <= value <= 10000:
            raise ToolError("The daily limit must be between 1 and 10000")
        card = self._card(card_id)
        if card["daily_limit"] == value:
            raise ToolError(f"The daily limit of card {card_id} is already {value:.2f}")
        self.db.execute("UPDATE cards SET daily_limit = ? WHERE card_id = ?", (value, card_id))
        return self._card(card_id)
